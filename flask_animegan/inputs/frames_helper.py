"""Probing and decoding animations and videos in a helper process, with time and memory
limits: :func:`isolated_probe`, :func:`isolated_frames` and :func:`isolated_audio`, the
isolated versions of :func:`.media.probe`, :func:`.media.frames` and :func:`.media.audio`.

The helper is ``python -m flask_animegan.inputs.frames_helper`` (Pillow, NumPy and PyAV;
never torch nor Flask). As :mod:`.helper` does, it reads one request at a time from
stdin and writes its answers to stdout:

* request: ``>II`` (header length, data length), a JSON header (``op``: "probe",
  "frames" or "audio"; ``limits``, ``decode``, ``memory``; for frames ``info``, ``size``,
  ``square``; for audio ``info``), then the file's bytes;
* answers: ``>II`` (header length, payload length) and a JSON header, then the payload.
  A probe answers once (``ok``, ``info``). Frames answer once a frame (``ok``, ``frame``:
  index, width, height, duration_ms, disposal, pts; the payload is the fitted frame's RGB
  pixels), then ``ok`` with ``end``. Audio answers once (``ok``, ``audio``: null, or the
  track's codec, transcoded and complete; the payload is its M4A). An error ends any of
  them: ``ok: false``, ``error`` (the exception's class name), ``message``.

The request runs under an address-space limit of ``memory`` bytes above what the helper
already uses. Frames are written as they are decoded and the pipe holds about one, so
the helper decodes at the pace the caller takes them, one frame ahead. A helper that
takes longer than the time limits (per frame, and in all for the time spent waiting on
it) is killed, as is one whose caller stops reading; a clean one is kept for the next
request of this process.
"""

from __future__ import annotations

import atexit
import math
import mmap
import time
import warnings
from collections.abc import Generator
from dataclasses import asdict
from typing import Any, BinaryIO

from PIL import Image

from ..errors import (
    BadImage,
    ConversionError,
    ImageTooLarge,
    Overloaded,
    UnsupportedImage,
)
from . import media
from .decoding import DecodeLimits
from .helper_process import (
    HelperPool,
    HelperProcess,
    address_space_limit,
    serve,
    write_answer,
)
from .media import AudioTrack, Frame, MediaInfo, MediaLimits

_ERRORS: dict[str, type[ConversionError]] = {
    cls.__name__: cls for cls in (BadImage, ImageTooLarge, UnsupportedImage)}
#: Address space the helper may take above what it holds when a request starts, beside
#: the decode's own peak (``DecodeLimits.max_bytes``): FFmpeg's and Python's slack.
SLACK_BYTES = 96 << 20


def default_memory(decode: DecodeLimits, size: int) -> int:
    """The address-space allowance for one request (the decode budget, a fitted frame and
    the slack)."""
    return decode.max_bytes + 3 * size * size + SLACK_BYTES


# -- the caller's side -------------------------------------------------------------------
#: What :class:`~.helper_process.HelperProcess` runs for animations and videos.
MODULE = "flask_animegan.inputs.frames_helper"
POOL = HelperPool(MODULE)
atexit.register(POOL.close)


def _failure(helper: HelperProcess, what: str) -> ConversionError:
    """The error for a helper that stopped answering (it is killed already)."""
    if helper.died_of_a_crash():
        return BadImage(f"the {what} crashed the decoder; it is corrupt. "
                        f"{media.MEDIA_HINT[0].upper()}{media.MEDIA_HINT[1:]}")
    return ImageTooLarge(f"the {what} could not be decoded within this server's memory "
                         "limit; send a smaller one")


def _overloaded(what: str, waited: float) -> Overloaded:
    """The error for a request that timed out while its helper hardly ran (the helper
    is killed already): the machine is busy, the file is not at fault (503)."""
    wait = max(1, math.ceil(waited))
    return Overloaded(f"the server is too busy to {what} now; try again in {wait} s", wait)


def isolated_probe(data: bytes, limits: MediaLimits, decode: DecodeLimits,
                   timeout: float, *, memory: int | None = None) -> MediaInfo:
    """:func:`.media.probe` in a helper process, killed after ``timeout`` s."""
    header = {"op": "probe", "limits": asdict(limits), "decode": asdict(decode),
              "memory": memory or default_memory(decode, 0)}
    helper = POOL.take()
    cpu_before = helper.cpu_seconds()
    try:
        helper.send(header, data)
        answer, _ = helper.receive(time.monotonic() + timeout)
    except TimeoutError:
        starved = helper.starved(cpu_before, timeout)
        POOL.discard(helper)
        if starved:
            raise _overloaded("read the file", timeout) from None
        raise ImageTooLarge(f"the file took more than {timeout:g} s to read; send a "
                            "smaller or simpler one") from None
    except (OSError, EOFError, ValueError):
        POOL.discard(helper)
        raise _failure(helper, "file") from None
    POOL.give_back(helper)
    if not answer["ok"]:
        raise _ERRORS.get(answer["error"], BadImage)(answer["message"])
    return MediaInfo(**answer["info"])


def isolated_frames(data: bytes, info: MediaInfo, limits: MediaLimits, decode: DecodeLimits,
                    *, size: int, square: bool = False, timeout_per_frame: float,
                    memory: int | None = None,
                    timeout_total: float | None = None) -> Generator[Frame, None, None]:
    """:func:`.media.frames` in a helper process, streamed. Raises ImageTooLarge when one
    frame takes more than ``timeout_per_frame`` s to arrive, when the time spent waiting
    for frames adds up to more than ``timeout_total`` s (None: no total limit), or when
    the helper dies for memory; the helper is then killed."""
    header = {"op": "frames", "limits": asdict(limits), "decode": asdict(decode),
              "info": asdict(info), "size": size, "square": square,
              "memory": memory or default_memory(decode, size)}
    helper = POOL.take()
    clean = False
    waited = 0.0
    try:
        helper.send(header, data)
        while True:
            started = time.monotonic()
            wait = timeout_per_frame
            if timeout_total is not None:
                wait = min(wait, max(0.0, timeout_total - waited))
            cpu_before = helper.cpu_seconds()
            try:
                answer, pixels = helper.receive(started + wait)
            except TimeoutError:
                if helper.starved(cpu_before, wait):
                    raise _overloaded(f"decode the {info.kind}", wait) from None
                total = timeout_total is not None and waited + wait >= timeout_total
                raise ImageTooLarge(
                    f"decoding the {info.kind} took more than "
                    + (f"{timeout_total:g} s in all" if total
                       else f"{timeout_per_frame:g} s for one frame")
                    + "; send a shorter, smaller or simpler one") from None
            except (OSError, EOFError, ValueError):
                helper.kill()
                raise _failure(helper, info.kind) from None
            waited += time.monotonic() - started
            if not answer["ok"]:
                clean = True
                raise _ERRORS.get(answer["error"], BadImage)(answer["message"])
            if answer.get("end"):
                clean = True
                return
            yield frame_of(answer["frame"], pixels)
    finally:
        if clean:
            POOL.give_back(helper)
        else:
            POOL.discard(helper)


def audio_memory(info: MediaInfo, limits: MediaLimits) -> int:
    """The address-space allowance for extracting ``info``'s audio: the track twice (the
    M4A being written and its copy in the answer), the demuxer's buffers and the slack."""
    return 2 * media.audio_budget(info, limits)[1] + _PROBE_BYTES + SLACK_BYTES


def isolated_audio(data: bytes, info: MediaInfo, limits: MediaLimits, timeout: float, *,
                   memory: int | None = None) -> AudioTrack | None:
    """:func:`.media.audio` in a helper process, killed after ``timeout`` s (ImageTooLarge)
    or when it dies for memory; the MP4 writer muxes from the track it returns, so the
    upload's audio is parsed, decoded and transcoded only here."""
    if info.kind != "video" or not info.has_audio:
        return None
    header = {"op": "audio", "limits": asdict(limits), "decode": asdict(DecodeLimits()),
              "info": asdict(info), "memory": memory or audio_memory(info, limits)}
    helper = POOL.take()
    cpu_before = helper.cpu_seconds()
    try:
        helper.send(header, data)
        answer, payload = helper.receive(time.monotonic() + timeout)
    except TimeoutError:
        starved = helper.starved(cpu_before, timeout)
        POOL.discard(helper)
        if starved:
            raise _overloaded("read the video's audio", timeout) from None
        raise ImageTooLarge(f"the video's audio took more than {timeout:g} s to read; "
                            "send it with a shorter or simpler audio track") from None
    except (OSError, EOFError, ValueError):
        POOL.discard(helper)
        raise _failure(helper, "audio track") from None
    POOL.give_back(helper)
    if not answer["ok"]:
        raise _ERRORS.get(answer["error"], BadImage)(answer["message"])
    track = answer["audio"]
    if track is None:
        return None
    return AudioTrack(payload, str(track["codec"]), bool(track["transcoded"]),
                      bool(track["complete"]))


def frame_of(header: dict[str, Any], pixels: bytes) -> Frame:
    image = Image.frombytes("RGB", (int(header["width"]), int(header["height"])), pixels)
    return Frame(index=int(header["index"]), image=image,
                 duration_ms=int(header["duration_ms"]),
                 disposal=None if header["disposal"] is None else int(header["disposal"]),
                 pts=float(header["pts"]))


# -- the helper's side -------------------------------------------------------------------
def _error(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ConversionError):
        return {"ok": False, "error": exc.__class__.__name__, "message": str(exc)}
    if isinstance(exc, MemoryError):
        return {"ok": False, "error": ImageTooLarge.__name__,
                "message": "the file needs more memory to decode than this server allows; "
                           "send a smaller one"}
    return {"ok": False, "error": BadImage.__name__,
            "message": f"the file cannot be decoded ({exc.__class__.__name__}); "
                       f"{media.MEDIA_HINT}"}


def _out_of_reach(count: int) -> bool:
    """Whether ``count`` more bytes of address space are out of reach (an anonymous map
    counts against RLIMIT_AS without touching a page)."""
    try:
        mmap.mmap(-1, max(1, count)).close()
    except (OSError, MemoryError, ValueError):
        return True
    return False


def _serve(out: BinaryIO, request: dict[str, Any], data: bytes) -> None:
    """Answer one request, under its address-space limit."""
    limits = MediaLimits(**request["limits"])
    decode = DecodeLimits(**request["decode"])
    need = _PROBE_BYTES
    try:
        with address_space_limit(int(request["memory"])):
            try:
                with warnings.catch_warnings():
                    # Pillow's complaints about hostile files would fill the server's log
                    warnings.simplefilter("ignore", UserWarning)
                    _run(out, request, data, limits, decode)
            except BrokenPipeError:
                raise  # the caller is gone (serve ends the helper)
            except BadImage as exc:
                # FFmpeg reports a failed allocation as corrupt data: if the decode's own
                # estimate no longer fits under the limit, it was the memory
                if request["op"] == "frames":
                    need = media.frame_bytes_needed(MediaInfo(**request["info"]))
                write_answer(out, _error(MemoryError() if _out_of_reach(need) else exc))
            except Exception as exc:  # noqa: BLE001 - never die on a file
                write_answer(out, _error(exc))
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the limit could not be set
        write_answer(out, _error(exc))


#: What a probe needs at most beside the file (FFmpeg's probe buffers, Pillow's header).
_PROBE_BYTES = 32 << 20


def _run(out: BinaryIO, request: dict[str, Any], data: bytes, limits: MediaLimits,
         decode: DecodeLimits) -> None:
    if request["op"] == "probe":
        info = media.probe(data, limits, decode)
        write_answer(out, {"ok": True, "info": asdict(info)})
        return
    info = MediaInfo(**request["info"])
    if request["op"] == "audio":
        track = media.audio(data, info, limits)
        if track is None:
            write_answer(out, {"ok": True, "audio": None})
        else:
            write_answer(out, {"ok": True, "audio": {"codec": track.codec,
                                                "transcoded": track.transcoded,
                                                "complete": track.complete}}, track.data)
        return
    for frame in media.frames(data, info, limits, decode, size=int(request["size"]),
                              square=bool(request["square"])):
        head = {"index": frame.index, "width": frame.image.width,
                "height": frame.image.height, "duration_ms": frame.duration_ms,
                "disposal": frame.disposal, "pts": frame.pts}
        write_answer(out, {"ok": True, "frame": head}, frame.image.tobytes())
    write_answer(out, {"ok": True, "end": True})


def main() -> None:
    serve(_serve)


if __name__ == "__main__":
    main()
