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
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from ..config import (
    DECODE_TIMEOUT,
    ISOLATIONS,
    MAX_ASPECT_RATIO,
    MAX_JPEG_SCANS,
    Settings,
    media_limits,
)
from ..errors import (
    BadImage,
    ConversionError,
    ImageTooLarge,
    Overloaded,
    UnsupportedImage,
)
from . import decoding, media
from .media import AudioTrack, Frame, MediaInfo, MediaLimits
from .decoding import DecodedUpload, DecodeLimits, SampledUpload
from .helper import MODULE, sampled_of, upload_of
from .samples import BYTES as STATISTICS_BYTES
from .helper_process import STARVED_SHARE, HelperPool

__all__ = ["STARVED_SHARE", "DecodeGate", "Decoder", "HelperPool", "shared_gate"]
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


_POOL = HelperPool(MODULE)
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
                 max_queue: int, queue_timeout: float,
                 media: MediaLimits | None = None) -> None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}")
        self.limits = limits
        self.media = media or MediaLimits()
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
                                       max_aspect=MAX_ASPECT_RATIO,
                                       max_scans=MAX_JPEG_SCANS),
                   isolation=settings.decode_isolation, timeout=DECODE_TIMEOUT,
                   slots=settings.decoders, max_queue=settings.max_queue,
                   queue_timeout=settings.queue_timeout, media=media_limits(settings))

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
            return upload_of(*self._in_helper(data, size, square, sample=False))

    def sample(self, data: bytes, *, size: int, square: bool = False) -> SampledUpload:
        """The upload as the cache compares it (:func:`.decoding.sample_upload`): its
        statistics and, unless a JPEG, its image fitted to ``size``; raises
        ConversionError."""
        with self.gate.slot(self.max_queue, self.queue_timeout):
            if self.isolation == "thread":
                return decoding.sample_upload(data, self.limits, size=size, square=square)
            return sampled_of(*self._in_helper(data, size, square, sample=True))

    def probe(self, data: bytes) -> MediaInfo:
        """What the upload is (still, animation, video), checked against the media limits."""
        if self.isolation == "thread":
            return media.probe(data, self.media, self.limits)
        from .frames_helper import isolated_probe

        return isolated_probe(data, self.media, self.limits, self.timeout)

    def frames(self, data: bytes, info: MediaInfo, *, size: int, square: bool = False,
               timeout_total: float | None = None) -> Iterator[Frame]:
        """The frames of a probed upload, fitted to ``size``, one at a time."""
        if self.isolation == "thread":
            return media.frames(data, info, self.media, self.limits, size=size, square=square)
        from .frames_helper import isolated_frames

        return isolated_frames(data, info, self.media, self.limits, size=size, square=square,
                               timeout_per_frame=self.timeout, timeout_total=timeout_total)

    def audio(self, data: bytes, info: MediaInfo, timeout: float) -> AudioTrack | None:
        """The audio track of a probed video, within the media limits (None: none)."""
        from .frames_helper import isolated_audio

        return isolated_audio(data, info, self.media, timeout)

    def _in_helper(self, data: bytes, size: int, square: bool, *,
                   sample: bool) -> tuple[dict[str, Any], bytes]:
        header = {"size": size, "square": square, "sample": sample,
                  "limits": asdict(self.limits),
                  # the decode's peak (max_bytes counts every copy), the answer's bytes
                  # and the allocator's and interpreter's slack
                  "memory": self.limits.max_bytes + 3 * size * size + STATISTICS_BYTES
                  + (64 << 20)}
        for attempt in (1, 2):
            helper = self.pool.take()
            cpu_before = helper.cpu_seconds()
            try:
                answer, pixels = helper.request(header, data, self.timeout)
            except TimeoutError:
                starved = helper.starved(cpu_before, self.timeout)
                self.pool.discard(helper)
                if starved:
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
        return answer, pixels

    def status(self) -> dict[str, Any]:
        return {"isolation": self.isolation, "slots": self.gate.slots,
                "pending": self.gate.pending, "helpers_started": self.pool.started,
                "helpers_killed": self.pool.killed}
