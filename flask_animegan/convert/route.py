"""Where an upload goes, for the views and the CLI: a photo is converted at once; an
animation, a video, or a photo that runs in tiles (long work) becomes a job."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import ConversionError, ImageTooLarge, UnsupportedImage
from ..inputs.media import MEDIA_HINT, MediaInfo, other_container

_PNG = b"\x89PNG\r\n\x1a\n"
#: How far into a PNG its animation chunk (acTL) is looked for.
_APNG_WINDOW = 64 << 10


def may_move(data: bytes) -> bool:
    """Whether ``data`` may be an animation or a video, from its first bytes alone, so
    that a still photo costs no probe in a helper process."""
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


def route(data: bytes, probe: Callable[[bytes], MediaInfo] | None,
          tiles: Callable[[MediaInfo], int] | None = None) -> MediaInfo | None:
    """The probe of an animation or a video (a job), or of a photo that ``tiles`` says runs
    in tiles (a job too; None: no size asked for may tile), or None for a photo converted
    now. A file that only looked like one is left to the photo decoder; one over a job's
    limits, or in a container we do not read (415), is refused here."""
    if probe is None:  # no jobs in this app: everything is a photo
        return None
    container = other_container(data)
    if container is not None:
        raise UnsupportedImage(f"{container} videos are not accepted; {MEDIA_HINT}")
    if not may_move(data) and tiles is None:
        return None
    try:
        info = probe(data)
    except ImageTooLarge:
        raise
    except ConversionError:
        return None
    if info.kind == "still":
        return info if tiles is not None and tiles(info) > 0 else None
    return info
