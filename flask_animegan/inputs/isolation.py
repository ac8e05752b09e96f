"""Reading untrusted files for an app (:class:`Decoder`): in a helper process under time and
memory limits (``ANIMEGAN_DECODE_ISOLATION = "process"``) or in this thread; still decodes
also pass a Gate shared by the process."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from PIL import Image

from ..config import DECODE_TIMEOUT, ISOLATIONS, Derived, Settings
from ..errors import (
    BadImage,
    ConversionError,
    ImageTooLarge,
    Overloaded,
    UnsupportedImage,
)
from ..gate import Gate
from . import decoding, media
from .decoding import DecodedUpload, DecodeLimits
from .helper import FRAME, MODULE, PROBE_BYTES
from .media import AudioTrack, Frame, MediaInfo, MediaLimits

_ERRORS: dict[str, type[ConversionError]] = {
    cls.__name__: cls for cls in (BadImage, ImageTooLarge, UnsupportedImage)}
#: A request that runs past its timeout having had less than this share of it in CPU
#: time was starved by the load (503, try again), not slow by itself (413, another file).
STARVED_SHARE = 0.5
#: Address space a helper may take beside the decode budget: FFmpeg's and Python's slack.
SLACK_BYTES = 96 << 20
#: The size asked for each pipe to and from a helper (Linux's most by default).
PIPE_BYTES = 1 << 20


class HelperProcess:
    """One helper process, owned by the process that started it (a copy inherited across
    a fork is never used nor killed by the child)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        package_parent = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent,
                                                          env.get("PYTHONPATH"))))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        self.owner = os.getpid()
        self.process = subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, bufsize=0)
        for stream in (self.process.stdin, self.process.stdout):
            # an upload or an answer in one go, not in 64 KiB turns (Linux only)
            with contextlib.suppress(AttributeError, OSError):
                fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]

    def send(self, header: dict[str, Any], data: bytes) -> None:
        head = json.dumps(header).encode()
        assert self.process.stdin is not None  # stdin=PIPE
        self.process.stdin.write(FRAME.pack(len(head), len(data)) + head)
        self.process.stdin.write(data)

    def receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        """One answer by ``deadline`` (monotonic) or TimeoutError; EOFError if it exited."""
        head_len, payload_len = FRAME.unpack(self._read(FRAME.size, deadline))
        return json.loads(self._read(head_len, deadline)), self._read(payload_len, deadline)

    def request(self, header: dict[str, Any], data: bytes,
                timeout: float) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait at most ``timeout`` s for its (first) answer."""
        self.send(header, data)
        return self.receive(time.monotonic() + timeout)

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
                raise EOFError("the helper exited")
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

    def crashed(self) -> bool:
        """Whether the helper ended by a signal other than a kill (the kernel's OOM killer
        sends SIGKILL; a decoder that crashes, SIGSEGV or SIGABRT)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(1)
        code = self.process.returncode
        return code is not None and code < 0 and -code != signal.SIGKILL

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
    """Idle helpers of this process, started on demand and reused."""

    def __init__(self) -> None:
        self._idle: list[HelperProcess] = []
        self._lock = threading.Lock()
        self.started = 0
        self.killed = 0

    def take(self) -> HelperProcess:
        with self._lock:
            while self._idle:
                helper = self._idle.pop()
                if helper.owner == os.getpid() and helper.process.poll() is None:
                    return helper
            self.started += 1
        return HelperProcess()

    def give_back(self, helper: HelperProcess) -> None:
        with self._lock:
            self._idle.append(helper)

    def discard(self, helper: HelperProcess) -> None:
        with self._lock:
            self.killed += 1
        helper.kill()

    def close(self) -> None:
        with self._lock:
            helpers, self._idle = self._idle, []
        for helper in helpers:
            helper.kill()


POOL = HelperPool()
atexit.register(POOL.close)
#: The process's decode gates: the cores are the process's, not one app's.
_GATES: dict[tuple[int, int, float], Gate] = {}
_GATES_LOCK = threading.Lock()


class Decoder:
    """Reads uploads for one app within its limits: stills, media probes, frames, audio.
    The defaults are the settings' defaults (an app builds it :meth:`from_settings`)."""

    def __init__(self, *, limits: DecodeLimits | None = None, media: MediaLimits | None = None,
                 isolation: str = "process", timeout: float = 5.0, slots: int = 1,
                 max_queue: int = 2, queue_timeout: float = 60.0,
                 memory: int | None = None) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.limits = limits or DecodeLimits()
        self.media = media or MediaLimits()
        self.isolation = isolation
        self.timeout = timeout
        #: a helper's address space per request above its own (None: from the budgets)
        self.memory = memory
        with _GATES_LOCK:
            self.gate = _GATES.setdefault((slots, max_queue, queue_timeout), Gate(
                slots=slots, max_queue=max_queue, queue_timeout=queue_timeout,
                work="reading other uploads", seconds=0.2))
        self.pool = POOL

    @classmethod
    def from_settings(cls, settings: Settings, derived: Derived | None = None) -> Decoder:
        """The decoder of the settings and their ``derived`` limits (made here if None)."""
        derived = derived or Derived.from_settings(settings)
        return cls(limits=derived.decode, media=derived.media,
                   isolation=settings.decode_isolation, timeout=DECODE_TIMEOUT,
                   slots=settings.decoders, max_queue=settings.max_queue,
                   queue_timeout=settings.queue_timeout)

    def start(self) -> None:
        """Have a helper idle now (this process's own), so that the first upload does not wait."""
        if self.isolation == "process":
            self.pool.give_back(self.pool.take())

    def decode(self, data: bytes, *, size: int, square: bool = False,
               cover: bool = False) -> DecodedUpload:
        """The still upright, fitted to ``size`` (:func:`.decoding.fit`); ConversionError."""
        with self.gate.slot():
            if self.isolation == "thread":
                return decoding.decode_upload(data, self.limits, size=size, square=square,
                                              cover=cover)
            side = size * size * (self.limits.max_aspect if cover else 1)
            header = {"op": "decode", "size": size, "square": square, "cover": cover,
                      "memory": self._memory(3 * int(side))}
            answer, pixels = self._ask_one(header, data, "the image", "read the upload")
        image = Image.frombytes("RGB", (int(answer["width"]), int(answer["height"])), pixels)
        width, height = answer["source_size"]
        return DecodedUpload(image, (int(width), int(height)), str(answer["format"]))

    def probe(self, data: bytes) -> MediaInfo:
        """What the upload is (:func:`.media.probe`), checked against the limits."""
        if self.isolation == "thread":
            return media.probe(data, self.media, self.limits)
        answer, _ = self._ask_one({"op": "probe", "memory": self._memory(0)}, data,
                                  "the file", "read the file")
        return MediaInfo(**answer["info"])

    def frames(self, data: bytes, info: MediaInfo, *, size: int, square: bool = False,
               start: int = 0, total_timeout: float | None = None) -> Iterator[Frame]:
        """``info``'s frames from index ``start`` fitted to ``size``, streamed
        (:func:`.media.frames`). Isolated, each frame may take the decode timeout, and all
        the waits ``total_timeout`` s."""
        if self.isolation == "thread":
            yield from media.frames(data, info, self.media, self.limits, size=size,
                                    square=square, start=start)
            return
        header = {"op": "frames", "info": asdict(info), "size": size, "square": square,
                  "start": start, "memory": self._memory(3 * size * size)}
        for answer, pixels in self._ask(header, data, f"the {info.kind}",
                                        f"decode the {info.kind}", total_timeout):
            if "frame" in answer:
                head = answer["frame"]
                yield Frame(int(head["index"]), Image.frombytes(
                    "RGB", (int(head["width"]), int(head["height"])), pixels),
                    int(head["duration_ms"]),
                    None if head["disposal"] is None else int(head["disposal"]),
                    float(head["pts"]))

    def audio(self, data: bytes, info: MediaInfo, *,
              timeout: float | None = None) -> AudioTrack | None:
        """The video's audio made ready for the MP4 writer (:func:`.media.audio`), so the
        upload's audio is parsed only here."""
        if info.kind != "video" or not info.has_audio:
            return None
        if self.isolation == "thread":
            return media.audio(data, info, self.media)
        memory = self.memory or (2 * media.audio_budget(info, self.media)[1] + PROBE_BYTES
                                 + SLACK_BYTES)
        answer, payload = self._ask_one({"op": "audio", "info": asdict(info), "memory": memory},
                                        data, "the video's audio", "read the video's audio",
                                        timeout)
        track = answer["audio"]
        if track is None:
            return None
        return AudioTrack(payload, str(track["codec"]), bool(track["transcoded"]),
                          bool(track["complete"]))

    def _memory(self, answer_bytes: int) -> int:
        return self.memory or self.limits.max_bytes + answer_bytes + SLACK_BYTES

    def _ask_one(self, header: dict[str, Any], data: bytes, what: str, doing: str,
                 timeout: float | None = None) -> tuple[dict[str, Any], bytes]:
        with contextlib.closing(self._ask(header, data, what, doing, None, timeout)) as answers:
            return next(answers)

    def _ask(self, header: dict[str, Any], data: bytes, what: str, doing: str,
             total: float | None, timeout: float | None = None,
             ) -> Generator[tuple[dict[str, Any], bytes], None, None]:
        """A helper's answers to one request. Past ``timeout`` (``total``: all waits together) the
        helper is killed: 503 if it hardly ran (the load's fault), else 413; a helper that dies
        is a 400 if it crashed, else a 413 (killed for memory)."""
        timeout = self.timeout if timeout is None else timeout
        header = {**header, "decode": asdict(self.limits), "media": asdict(self.media)}
        helper = self._sent(header, data, what)
        clean, waited = False, 0.0
        try:
            while True:
                wait = timeout if total is None else min(timeout, max(0.0, total - waited))
                cpu_before, started = helper.cpu_seconds(), time.monotonic()
                try:
                    answer, payload = helper.receive(started + wait)
                except TimeoutError:
                    cpu_after = helper.cpu_seconds()
                    if (cpu_before is not None and cpu_after is not None
                            and cpu_after - cpu_before < STARVED_SHARE * wait):
                        retry = max(1, math.ceil(wait))
                        raise Overloaded(f"the server is too busy to {doing} now; try again "
                                         f"in {retry} s", retry) from None
                    spent = (f"{total:g} s in all" if total is not None and waited + wait >= total
                             else f"{timeout:g} s" + " for one frame" * ("info" in header))
                    raise ImageTooLarge(f"reading {what} took more than {spent}; send a "
                                        "smaller, shorter or simpler one") from None
                waited += time.monotonic() - started
                if not answer["ok"]:
                    clean = True
                    raise _ERRORS.get(answer["error"], BadImage)(answer["message"])
                clean = not answer.get("more")
                yield answer, payload
                if clean:
                    return
        except (OSError, EOFError, ValueError):
            helper.kill()
            if helper.crashed():
                raise BadImage(f"{what} crashed the decoder; it is corrupt. Send another "
                               "file") from None
            raise ImageTooLarge(f"{what} could not be decoded within this server's memory "
                                "limit; send a smaller one") from None
        finally:
            if clean:
                self.pool.give_back(helper)
            else:
                self.pool.discard(helper)

    def _sent(self, header: dict[str, Any], data: bytes, what: str) -> HelperProcess:
        """A helper that took the request; one gone since it went idle is replaced, once."""
        for _ in range(2):
            helper = self.pool.take()
            try:
                helper.send(header, data)
                return helper
            except OSError:
                self.pool.discard(helper)
        raise ImageTooLarge(f"{what} could not be handed to a decoder; send a smaller one")

    def status(self) -> dict[str, Any]:
        return {"isolation": self.isolation, "slots": self.gate.slots,
                "pending": self.gate.pending, "helpers_started": self.pool.started,
                "helpers_killed": self.pool.killed}
