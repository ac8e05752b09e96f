"""Where an upload goes: a still photo is converted at once, an animation or a video
becomes a job. One function, :func:`route`, decides it for the web views and the CLI."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConversionError, ImageTooLarge, UnsupportedImage
from ..inputs.media import MEDIA_HINT, MediaInfo, other_container

_PNG = b"\x89PNG\r\n\x1a\n"
#: How far into a PNG its animation chunk (acTL, before the first IDAT) is looked for.
_APNG_WINDOW = 64 << 10


def may_move(data: bytes) -> bool:
    """Whether ``data`` may be an animation or a video, from its first bytes alone: a GIF,
    a WebP with its animation flag, a PNG with an animation chunk near its start, an
    MP4/MOV (``ftyp``) or a Matroska/WebM (EBML). Nothing else is probed, so a still photo
    costs nothing more; what these are is decided in a helper process (:func:`route`)."""
    head = data[:32]
    if head[:6] in (b"GIF87a", b"GIF89a") or head[:4] == b"\x1a\x45\xdf\xa3":
        return True
    if head[:4] == b"RIFF" and head[8:16] == b"WEBPVP8X":
        return len(head) > 20 and bool(head[20] & 0x02)
    if head[:8] == _PNG:
        window = data[:_APNG_WINDOW]
        animation, pixels = window.find(b"acTL"), window.find(b"IDAT")
        return animation > 0 and (pixels < 0 or animation < pixels)
    return head[4:8] == b"ftyp"


def route(data: bytes, probe: Callable[[bytes], MediaInfo] | None) -> MediaInfo | None:
    """Where an upload goes: the probe of an animation or a video (a job), or None for a
    still photo (converted at once). A file that only looked like one (a broken GIF, a PNG with a stray
    ``acTL``) is left to the photo decoder, which refuses it or converts it as before;
    one over a job's limits is refused here, as is a video in a container that is not read
    (AVI, MPEG, ...: 415 naming those that are)."""
    if probe is None:  # no jobs in this app: everything is a photo
        return None
    container = other_container(data)
    if container is not None:
        raise UnsupportedImage(f"{container} videos are not accepted; {MEDIA_HINT}")
    if not may_move(data):
        return None
    try:
        info = probe(data)
    except ImageTooLarge:
        raise
    except ConversionError:
        return None
    return None if info.kind == "still" else info
