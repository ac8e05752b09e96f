"""Where uploads are decoded: a gate that bounds how many at once, and helper processes.

Decoding runs before the model's queue and can cost as much as a conversion (a
progressive JPEG is decoded once per scan; a small PNG can inflate to gigabytes).
So every decode passes a :class:`DecodeGate`: at most ``slots`` at once per process
(one per core), at most ``max_queue`` more waiting, for at most ``queue_timeout``
seconds; the rest get 503 with Retry-After, as the model's queue does.

With ``ANIMEGAN_DECODE_ISOLATION = "process"`` (the default) the decode itself runs in
a helper process (:mod:`flask_animegan.inputs.helper`) with an address-space limit;
one that runs past ``ANIMEGAN_DECODE_TIMEOUT`` is killed, so a pathological file costs
at most that many seconds of one core and never the server's memory. ``"thread"``
decodes in the server process, with the same gate and header checks but no hard
time or memory limit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import ISOLATIONS, Settings
from ..errors import (
    BadImage,
    ConversionError,
    ImageTooLarge,
    Overloaded,
    UnsupportedImage,
)
from . import decoding
from .decoding import DecodedUpload, DecodeLimits
from .helper import FRAME, upload_of

#: A decode that runs past its timeout having had less than this share of it in CPU time
#: was starved by the load (503, try again), not slow by itself (413, send another file).
STARVED_SHARE = 0.5
_ERRORS: dict[str, type[ConversionError]] = {
    cls.__name__: cls for cls in (BadImage, ImageTooLarge, UnsupportedImage)}


class DecodeGate:
    """At most ``slots`` decodes at once in this process; a bounded, timed wait for the rest."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._free = threading.Semaphore(slots)
        self._lock = threading.Lock()
        self._pending = 0
        self._seconds_per_decode = 0.2

    @contextlib.contextmanager
    def slot(self, max_queue: int, queue_timeout: float) -> Iterator[None]:
        with self._lock:
            if self._pending >= self.slots + max_queue:
                raise Overloaded("the server is busy reading other uploads; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            self._pending += 1
        try:
            if not self._free.acquire(timeout=queue_timeout):
                raise Overloaded("timed out waiting to read the upload; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            started = time.perf_counter()
            try:
                yield
            finally:
                self._free.release()
                elapsed = time.perf_counter() - started
                self._seconds_per_decode = 0.8 * self._seconds_per_decode + 0.2 * elapsed
        finally:
            with self._lock:
                self._pending -= 1

    def retry_after(self) -> int:
        return max(1, math.ceil(self._seconds_per_decode * max(1, self._pending) / self.slots))

    @property
    def pending(self) -> int:
        return self._pending


class _Helper:
    """One helper process (:mod:`.helper`), owned by the process that started it."""

    def __init__(self) -> None:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent,
                                                          env.get("PYTHONPATH"))))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        self.owner = os.getpid()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flask_animegan.inputs.helper"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, bufsize=0)

    def request(self, header: dict[str, Any], data: bytes,
                timeout: float) -> tuple[dict[str, Any], bytes]:
        """Send one decode and wait at most ``timeout`` s for the answer (TimeoutError)."""
        head = json.dumps(header).encode()
        stdin = self.process.stdin
        assert stdin is not None  # stdin=PIPE
        stdin.write(FRAME.pack(len(head), len(data)) + head)
        stdin.write(data)
        deadline = time.monotonic() + timeout
        head_len, payload_len = FRAME.unpack(self._read(FRAME.size, deadline))
        answer = json.loads(self._read(head_len, deadline))
        return answer, self._read(payload_len, deadline)

    def _read(self, count: int, deadline: float) -> bytes:
        assert self.process.stdout is not None  # stdout=PIPE
        fd = self.process.stdout.fileno()
        chunks, remaining = [], count
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                raise EOFError("the decode helper exited")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def cpu_seconds(self) -> float | None:
        """The CPU time the helper has used so far (None where /proc cannot say)."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def kill(self) -> None:
        if self.owner != os.getpid():
            return  # inherited across a fork: the parent's, not ours to kill
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class HelperPool:
    """Idle decode helpers of this process, started on demand and reused."""

    def __init__(self) -> None:
        self._idle: list[_Helper] = []
        self._lock = threading.Lock()
        self.started = 0
        self.killed = 0

    def take(self) -> _Helper:
        with self._lock:
            while self._idle:
                helper = self._idle.pop()
                if helper.owner == os.getpid() and helper.process.poll() is None:
                    return helper
            self.started += 1
        return _Helper()

    def give_back(self, helper: _Helper) -> None:
        with self._lock:
            self._idle.append(helper)

    def discard(self, helper: _Helper) -> None:
        self.killed += 1
        helper.kill()

    def prestart(self, count: int) -> None:
        """Start helpers now (at app startup) so the first uploads do not wait for them."""
        with self._lock:
            # helpers inherited across a fork are the parent's: they do not count
            self._idle = [h for h in self._idle if h.owner == os.getpid()]
            missing = max(0, count - len(self._idle))
            self.started += missing
        helpers = [_Helper() for _ in range(missing)]
        with self._lock:
            self._idle.extend(helpers)

    def close(self) -> None:
        with self._lock:
            helpers, self._idle = self._idle, []
        for helper in helpers:
            helper.kill()


_POOL = HelperPool()
atexit.register(_POOL.close)
_GATES: dict[int, DecodeGate] = {}
_GATES_LOCK = threading.Lock()


def shared_gate(slots: int) -> DecodeGate:
    """The process-wide gate for ``slots`` (the cores are the process's, not one app's)."""
    with _GATES_LOCK:
        return _GATES.setdefault(slots, DecodeGate(slots))


class Decoder:
    """Decodes uploads for one app: the gate, then a helper process or this thread."""

    def __init__(self, *, limits: DecodeLimits, isolation: str, timeout: float, slots: int,
                 max_queue: int, queue_timeout: float) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.limits = limits
        self.isolation = isolation
        self.timeout = timeout
        self.gate = shared_gate(slots)
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.pool = _POOL

    @classmethod
    def from_settings(cls, settings: Settings) -> Decoder:
        """A decoder with the ANIMEGAN_MAX_*, DECODE_* and queue settings."""
        return cls(limits=DecodeLimits(max_pixels=settings.max_pixels,
                                       max_bytes=settings.max_decode_bytes,
                                       max_aspect=settings.max_aspect_ratio,
                                       max_scans=settings.max_jpeg_scans),
                   isolation=settings.decode_isolation, timeout=settings.decode_timeout,
                   slots=settings.decoders, max_queue=settings.max_queue,
                   queue_timeout=settings.queue_timeout)

    def start(self) -> None:
        """Start a helper process now, so that the first upload does not wait for one."""
        if self.isolation == "process":
            self.pool.prestart(1)

    def decode(self, data: bytes, *, size: int, square: bool = False) -> DecodedUpload:
        """The upload decoded, its image upright RGB fitted to ``size``; raises
        ConversionError."""
        with self.gate.slot(self.max_queue, self.queue_timeout):
            if self.isolation == "thread":
                return decoding.decode_upload(data, self.limits, size=size, square=square)
            return self._decode_in_helper(data, size, square)

    def _decode_in_helper(self, data: bytes, size: int, square: bool) -> DecodedUpload:
        header = {"size": size, "square": square, "limits": asdict(self.limits),
                  # the decode's peak (max_bytes counts every copy), the answer's bytes
                  # and the allocator's and interpreter's slack
                  "memory": self.limits.max_bytes + 3 * size * size + (64 << 20)}
        for attempt in (1, 2):
            helper = self.pool.take()
            cpu_before = helper.cpu_seconds()
            try:
                answer, pixels = helper.request(header, data, self.timeout)
            except TimeoutError:
                cpu_after = helper.cpu_seconds()
                self.pool.discard(helper)
                if (cpu_before is not None and cpu_after is not None
                        and cpu_after - cpu_before < STARVED_SHARE * self.timeout):
                    # the helper hardly ran (a busy machine, helpers at a lower priority):
                    # the file is not at fault, the load is
                    wait = self.gate.retry_after()
                    raise Overloaded("the server is too busy to read the upload now; try "
                                     f"again in {wait} s", wait) from None
                raise ImageTooLarge(f"the image took more than {self.timeout:g} s to decode; "
                                    "send a smaller or simpler image") from None
            except (OSError, EOFError, ValueError):
                # a helper that died (killed by the kernel for memory, or gone while
                # idle): start a fresh one once, then give up on this file
                self.pool.discard(helper)
                if attempt == 2:
                    raise ImageTooLarge("the image could not be decoded within this "
                                        "server's memory limit; send a smaller image") from None
                continue
            self.pool.give_back(helper)
            break
        if not answer["ok"]:
            raise _ERRORS.get(answer["error"], BadImage)(answer["message"])
        return upload_of(answer, pixels)

    def status(self) -> dict[str, Any]:
        return {"isolation": self.isolation, "slots": self.gate.slots,
                "pending": self.gate.pending, "helpers_started": self.pool.started,
                "helpers_killed": self.pool.killed}
