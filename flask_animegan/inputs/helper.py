"""The helper program that reads untrusted files (``python -m flask_animegan.inputs.helper``):
decode, probe, frames and audio requests from stdin, each under an address-space limit.
Wire format both ways: ``>II`` (JSON header length, payload length), header, payload."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import resource
import struct
import sys
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, BinaryIO

from ..errors import BadImage, ConversionError, ImageTooLarge
from ..process import configure_decoding
from . import media
from .decoding import DecodeLimits, decode_upload
from .media import MediaInfo, MediaLimits

MODULE = "flask_animegan.inputs.helper"
#: A frames request that starts past the first frame says it lives every this many
#: frames it decodes before the start, so each wait stays within the decode timeout.
SKIPPED_REPORT = 25
FRAME = struct.Struct(">II")
#: Helpers run below the server's CPU priority: a flood of slow files then takes only the
#: CPU that the server's own threads (/healthz, the pages, inference) leave.
NICENESS = 10
#: What a request may need beside its decode budget: FFmpeg's probe buffers, Pillow's
#: header, the interpreter's slack.
PROBE_BYTES = 32 << 20


def read_exact(stream: BinaryIO, count: int) -> bytes | None:
    """``count`` bytes from ``stream``, or None at end of file."""
    chunks, remaining = [], count
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def write_message(out: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    out.write(FRAME.pack(len(head), len(payload)) + head)
    out.write(payload)
    out.flush()


@contextlib.contextmanager
def address_space_limit(memory: int) -> Iterator[None]:
    """RLIMIT_AS at ``memory`` bytes above what this process holds now (never above the
    hard limit), restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        cap = int(statm.read().split()[0]) * resource.getpagesize() + int(memory)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def error_of(exc: BaseException) -> dict[str, Any]:
    """The answer for a request that failed with ``exc``."""
    if isinstance(exc, ConversionError):
        return {"ok": False, "error": exc.__class__.__name__, "message": str(exc)}
    if isinstance(exc, MemoryError):
        return {"ok": False, "error": ImageTooLarge.__name__,
                "message": "the file needs more memory to decode than this server allows; "
                           "send a smaller one"}
    return {"ok": False, "error": BadImage.__name__,
            "message": f"the file cannot be decoded ({exc.__class__.__name__})"}


def _out_of_reach(count: int) -> bool:
    """Whether ``count`` more bytes of address space are out of reach (an anonymous map
    counts against RLIMIT_AS without touching a page)."""
    try:
        mmap.mmap(-1, max(1, count)).close()
    except (OSError, MemoryError, ValueError):
        return True
    return False


def _run(out: BinaryIO, request: dict[str, Any], data: bytes) -> None:
    decode, limits = DecodeLimits(**request["decode"]), MediaLimits(**request["media"])
    op = request["op"]
    if op == "decode":
        decoded = decode_upload(data, decode, size=int(request["size"]),
                                square=bool(request["square"]), cover=bool(request["cover"]))
        write_message(out, {"ok": True, "width": decoded.image.width,
                            "height": decoded.image.height, "source_size": decoded.source_size,
                            "format": decoded.format}, decoded.image.tobytes())
    elif op == "probe":
        write_message(out, {"ok": True, "info": asdict(media.probe(data, limits, decode))})
    elif op == "audio":
        track = media.audio(data, MediaInfo(**request["info"]), limits)
        head = None if track is None else {"codec": track.codec, "transcoded": track.transcoded,
                                           "complete": track.complete}
        write_message(out, {"ok": True, "audio": head}, track.data if track else b"")
    else:
        def skipped(index: int) -> None:  # frames before the start: a sign of life
            if index % SKIPPED_REPORT == 0:
                write_message(out, {"ok": True, "more": True, "skipped": index})

        for frame in media.frames(data, MediaInfo(**request["info"]), limits, decode,
                                  size=int(request["size"]), square=bool(request["square"]),
                                  start=int(request.get("start", 0)), skipped=skipped):
            head = {"index": frame.index, "width": frame.image.width,
                    "height": frame.image.height, "duration_ms": frame.duration_ms,
                    "disposal": frame.disposal, "pts": frame.pts}
            write_message(out, {"ok": True, "more": True, "frame": head},
                          frame.image.tobytes())
        write_message(out, {"ok": True})


def answer(out: BinaryIO, request: dict[str, Any], data: bytes) -> None:
    """Answer one request under its address-space limit, never raising for a file: every
    message has ``ok``, all but the last ``more``; an error (``ok`` false, ``error``,
    ``message``) is the last."""
    try:
        with address_space_limit(int(request["memory"])), warnings.catch_warnings():
            # Pillow's complaints about hostile files would fill the server's log; the
            # bomb warning stays an error
            warnings.simplefilter("ignore", UserWarning)
            try:
                _run(out, request, data)
            except BadImage as exc:
                # FFmpeg reports a failed allocation as corrupt data: if the decode's own
                # estimate no longer fits under the limit, it was the memory
                need = PROBE_BYTES
                if request["op"] == "frames":
                    need = media.frame_bytes_needed(MediaInfo(**request["info"]))
                write_message(out, error_of(MemoryError() if _out_of_reach(need) else exc))
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - never die on a file
        write_message(out, error_of(exc))


def main() -> None:
    """Serve requests until stdin closes (the server is gone)."""
    os.nice(NICENESS)
    configure_decoding()
    # answers go to the original stdout; anything a library prints goes to stderr
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    while True:
        frame = read_exact(stdin, FRAME.size)
        if frame is None:
            return
        head_len, data_len = FRAME.unpack(frame)
        head, data = read_exact(stdin, head_len), read_exact(stdin, data_len)
        if head is None or data is None:
            return
        try:
            answer(out, json.loads(head), data)
        except BrokenPipeError:
            # the caller stopped reading: nothing is left to answer, and no traceback
            # for its log (nor a flush at exit) is wanted
            os._exit(0)


if __name__ == "__main__":
    main()
