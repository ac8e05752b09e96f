"""A job's frames in segments: each a stretch of a few seconds converted, encoded and kept
on its own, so that a run that dies loses one segment at most and a later run resumes at
the first one missing. A segment starts afresh (no repeat reused across its start), so a
resumed job comes out as an uninterrupted one does."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from ..inputs.media import MediaInfo

#: Seconds of video one segment holds: a lost run costs this much work at most, and the
#: page plays the first segment this soon (a keyframe per segment, as streaming sites cut).
SEGMENT_SECONDS = 2.0
#: Frame rate assumed for a video whose header gives none.
DEFAULT_FPS = 25.0
_HEADER = struct.Struct(">I")


def segment_frames(info: MediaInfo) -> int:
    """Frames per segment of ``info``: SEGMENT_SECONDS of a video; an animation is one
    segment (its formats are joined only as wholes, and its frames are few)."""
    if info.kind != "video":
        return max(1, info.frames)
    return max(1, round((info.fps or DEFAULT_FPS) * SEGMENT_SECONDS))


@dataclass
class Segment:
    """Frames ``start`` to ``start + frames`` converted: ``data`` plays them alone (a
    video's segment has no audio and its frames start at 0 s; ``start_s`` places them)."""

    index: int
    start: int  # the first frame's index in the upload
    frames: int
    reused: int  # frames that repeated the last converted one
    start_s: float  # the first frame's time in the upload
    end_s: float  # the end of the last frame, in the upload's time
    data: bytes
    #: why the job's frames end with this segment before the upload's last (StopFrames)
    stopped: str | None = None
    #: the first segment's first frame as a JPEG (a job's preview); not kept with it
    preview: bytes = field(default=b"", repr=False)

    def to_bytes(self) -> bytes:
        """The segment as kept in the job's storage: a JSON head, then ``data``."""
        head = asdict(self)
        del head["data"], head["preview"]
        return pack(head, self.data)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Segment | None:
        """The segment in ``blob``; None for something that is none."""
        unpacked = unpack(blob)
        if unpacked is None:
            return None
        try:
            return cls(**unpacked[0], data=unpacked[1])
        except TypeError:
            return None


def pack(head: dict[str, Any], data: bytes) -> bytes:
    """``head`` as JSON behind its length, then ``data``: how a job keeps a part of itself
    (a segment, its audio) with what describes it in one value."""
    encoded = json.dumps(head, separators=(",", ":")).encode()
    return _HEADER.pack(len(encoded)) + encoded + data


def unpack(blob: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The head and the data :func:`pack` made; None for anything else."""
    try:
        (size,) = _HEADER.unpack_from(blob)
        head = json.loads(blob[_HEADER.size:_HEADER.size + size])
    except (struct.error, ValueError):
        return None
    return (head, blob[_HEADER.size + size:]) if isinstance(head, dict) else None
