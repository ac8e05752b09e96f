"""Upload bodies on a deadline: a body that arrives slower than UPLOAD_MIN_RATE, after a
grace period, is cut with 408, so that trickling clients give back the threads they hold."""

from __future__ import annotations

import socket
import threading
import time
from typing import IO, Any

from werkzeug.exceptions import RequestTimeout

from ..config import UPLOAD_GRACE_SECONDS, UPLOAD_MIN_RATE

#: Seconds between two looks of the watch at the bodies being read.
_WATCH_POLL_S = 0.25


class TimedBody:
    """``wsgi.input``, counted as it is read; past its deadline (grace plus one second per
    UPLOAD_MIN_RATE bytes received) a read raises RequestTimeout. Under gunicorn the watch
    also shuts the socket for reading, which ends a read blocked on a trickle."""

    def __init__(self, inner: IO[bytes], sock: socket.socket | None,
                 length: int | None) -> None:
        self.inner, self.sock, self.length = inner, sock, length
        self.started = time.monotonic()
        self.received = 0
        self.finished = length == 0
        self.cut = False

    def deadline(self) -> float:
        return self.started + UPLOAD_GRACE_SECONDS + self.received / UPLOAD_MIN_RATE

    def read(self, size: int = -1) -> bytes:
        return self._counted(self.inner.read(size) if not self.cut else b"", size)

    def readline(self, size: int = -1) -> bytes:
        return self._counted(self.inner.readline(size) if not self.cut else b"", size)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _counted(self, data: bytes, size: int) -> bytes:
        self.received += len(data)
        if not self.cut and ((self.length is not None and self.received >= self.length)
                             or (not data and size)):
            self.finished = True
        if self.cut or (not self.finished and time.monotonic() > self.deadline()):
            self.cut = True
            raise RequestTimeout(
                f"the upload arrived too slowly: send it at {UPLOAD_MIN_RATE // 1024} KiB/s "
                f"or more (after the first {UPLOAD_GRACE_SECONDS:g} s)")
        return data

    def cut_off(self) -> None:
        """End a read blocked on this body's socket (the read then raises 408)."""
        self.cut = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RD)
            except OSError:  # closed already
                pass


class _Watch:
    """One thread per process that cuts off the bodies past their deadline."""

    def __init__(self) -> None:
        self._bodies: set[TimedBody] = set()
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, body: TimedBody) -> None:
        with self._lock:
            self._bodies.add(body)
            if self._thread is None or not self._thread.is_alive():  # none yet, or forked
                self._thread = threading.Thread(target=self._run, name="animegan-body-watch",
                                                daemon=True)
                self._thread.start()
            self._lock.notify()

    def discard(self, body: TimedBody) -> None:
        with self._lock:
            self._bodies.discard(body)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._bodies:
                    self._lock.wait()
                now = time.monotonic()
                late = [body for body in self._bodies
                        if not body.finished and now > body.deadline()]
                self._bodies.difference_update(
                    [body for body in self._bodies if body.finished] + late)
            for body in late:
                body.cut_off()
            time.sleep(_WATCH_POLL_S)


_watch = _Watch()


def time_the_body(environ: dict[str, Any]) -> TimedBody:
    """Put the request's body on its deadline (before anything reads it); ``release`` it
    when the request ends."""
    length = environ.get("CONTENT_LENGTH")
    if length and length.isdigit():
        size: int | None = int(length)
    else:  # no length: a chunked body (the server ends it) or none at all
        size = None if environ.get("wsgi.input_terminated") else 0
    body = TimedBody(environ["wsgi.input"], environ.get("gunicorn.socket"), size)
    environ["wsgi.input"] = body
    if body.sock is not None and not body.finished:
        _watch.add(body)
    return body


def release(body: TimedBody) -> None:
    """The request has ended: its body needs no more watching."""
    body.finished = True
    _watch.discard(body)
