"""What an upload is (still, animation, video), its frames and its audio, within limits: the
probe holds the headers against the limits, frames are counted again as they are decoded.
Pillow, NumPy and PyAV only: it also runs in the helper process."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import struct
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from PIL import Image

from ..config import MediaLimits as MediaLimits
from ..errors import BadImage, ConversionError, ImageTooLarge, UnsupportedImage
from . import decoding
from .decoding import DecodeLimits

#: The video codecs decoded (FFmpeg's names); others answer 415.
VIDEO_CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg", "prores"})
MEDIA_HINT = ("send a GIF, animated WebP or APNG, or an MP4, WebM or MOV video "
              "(H.264, HEVC, VP8, VP9 or AV1)")

#: A frame shown for this long or less is shown for :data:`DEFAULT_DURATION_MS`.
MIN_DURATION_MS = 10
DEFAULT_DURATION_MS = 100
#: What a video's header may understate: the frame rate may run this much above the
#: limit over the first second before decoding stops (variable frame rates jitter).
_FPS_GRACE_S = 1.0


@dataclass(frozen=True)
class MediaInfo:
    """What :func:`probe` found."""

    kind: str  # "still", "animation" or "video"
    format: str  # GIF, WEBP, PNG (APNG), MP4, MOV, WEBM, MKV; a still's Pillow format
    width: int
    height: int
    frames: int
    duration_s: float
    fps: float | None
    has_audio: bool
    #: times an animation plays (0: forever; None: once, no loop block); None for videos
    loop: int | None


@dataclass(frozen=True)
class AudioTrack:
    """A video's audio as :func:`audio` made it: one stream in an M4A of its own, timed from
    the video's first frame, ready to be copied into the MP4 result packet for packet."""

    data: bytes  # the M4A
    codec: str  # the source's codec (FFmpeg's name)
    transcoded: bool  # True: decoded and encoded as AAC; False: the source's packets
    complete: bool  # False: damaged packets were left out, or the track ended at one


@dataclass
class Frame:
    """One decoded frame, fitted to the requested size."""

    index: int
    image: Image.Image  # RGB
    duration_ms: int
    disposal: int | None  # GIF/APNG disposal of the source frame; None otherwise
    pts: float  # seconds from the start


def normal_duration(ms: float | None) -> int:
    """A frame's duration as it will be shown (see the module doc)."""
    if ms is None or not math.isfinite(ms) or ms <= MIN_DURATION_MS:
        return DEFAULT_DURATION_MS
    return round(ms)


# -- probing ---------------------------------------------------------------------------
def probe(data: bytes, limits: MediaLimits, decode: DecodeLimits) -> MediaInfo:
    """What ``data`` is, from its headers; raises BadImage (400), UnsupportedImage (415)
    or ImageTooLarge (413, over a limit) with a message that says what to send."""
    if not data:
        raise BadImage(f"the upload is empty; {MEDIA_HINT}")
    video = _video_demuxer(data)
    other = other_container(data)
    if video is None and other is not None:
        raise UnsupportedImage(f"{other} videos are not accepted; {MEDIA_HINT}")
    if video is not None:
        info = _probe_video(data, video, decode, min(limits.max_pixels, decode.max_pixels))
    else:
        info = _probe_picture(data, decode)
    if info.kind != "still":
        check(info, limits, decode)
    if video is not None and abs(_video_rotation(data, video, info)) == 90:
        # shown upright (a phone held upright): the frames come out the displayed size;
        # the limits held above are the same for both (the area, the aspect either way)
        info = dataclasses.replace(info, width=info.height, height=info.width)
    return info


def check(info: MediaInfo, limits: MediaLimits, decode: DecodeLimits) -> None:
    """Raise ImageTooLarge when ``info`` is over one of the limits."""
    what = _name(info)
    area = info.width * info.height
    if info.frames > limits.max_frames:
        raise ImageTooLarge(f"the {what} has {info.frames:,} frames; at most "
                            f"{limits.max_frames:,} are accepted. Send a shorter one")
    if info.duration_s > limits.max_seconds:
        raise ImageTooLarge(f"the {what} lasts {info.duration_s:.1f} s; at most "
                            f"{limits.max_seconds:g} s are accepted. Send a shorter one")
    if info.fps is not None and info.fps > limits.max_fps:
        raise ImageTooLarge(f"the {what} has {info.fps:.4g} frames a second; at most "
                            f"{limits.max_fps:g} are accepted. Send it at a lower frame rate")
    pixels = min(limits.max_pixels, decode.max_pixels)
    if area > pixels:
        raise ImageTooLarge(f"the {what}'s frames are {info.width}x{info.height} = "
                            f"{area:,} pixels; the limit is {pixels:,}. Send a smaller one")
    if max(info.width, info.height) > decode.max_aspect * min(info.width, info.height):
        raise ImageTooLarge(f"the {what} is {info.width}x{info.height}: one side is more "
                            f"than {decode.max_aspect:g} times the other")
    if info.frames * area > limits.max_total_pixels:
        raise ImageTooLarge(f"the {what} has {info.frames * area:,} pixels in all "
                            f"({info.frames:,} frames of {area:,}); the limit is "
                            f"{limits.max_total_pixels:,}. Send a shorter or smaller one")
    needed = frame_bytes_needed(info)
    if needed > decode.max_bytes:
        raise ImageTooLarge(f"decoding the {what}'s {info.width}x{info.height} frames "
                            f"needs {needed >> 20} MiB; the limit is "
                            f"{decode.max_bytes >> 20} MiB. Send a smaller one")


#: Bytes a pixel of the canvas that decoding one frame holds at its peak: Pillow's canvas
#: and its disposal copy (4 + 4), the frame's RGBA and RGB copies (4 + 4), a decoder's
#: own canvases (libwebp keeps two). Videos: up to 16 reference frames of YUV 4:2:0
#: (1.5 bytes a pixel each) in FFmpeg's pool, the RGB picture and Pillow's copy.
_ANIMATION_BYTES_PER_PIXEL = 24
_VIDEO_BYTES_PER_PIXEL = 18 * 1.5 + 8
_FIXED_BYTES = 16 << 20


def frame_bytes_needed(info: MediaInfo) -> int:
    """The most memory decoding one of ``info``'s frames holds (held against max_bytes)."""
    per_pixel = _VIDEO_BYTES_PER_PIXEL if info.kind == "video" else _ANIMATION_BYTES_PER_PIXEL
    return int(per_pixel * info.width * info.height) + _FIXED_BYTES


def _name(info: MediaInfo) -> str:
    if info.kind == "video":
        return f"{info.format} video"
    return {"PNG": "APNG", "WEBP": "WebP"}.get(info.format, info.format) + " animation"


def _probe_picture(data: bytes, decode: DecodeLimits) -> MediaInfo:
    """A still or an animation: Pillow's header checks, then the file's own blocks."""
    opened = decoding.open_upload(data, decode, MEDIA_HINT)  # 400 / 415 / 413
    image = opened.image
    fmt = str(image.format)
    width, height = image.size
    try:
        layout = _LAYOUTS[fmt](data) if fmt in _LAYOUTS else None
    except ConversionError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt header: whatever struct raises
        raise BadImage(f"the {fmt} file is truncated or corrupt ({exc.__class__.__name__}); "
                       f"{MEDIA_HINT}") from None
    finally:
        image.close()
    if layout is None or layout.frames <= 1:
        return MediaInfo("still", fmt, width, height, 1, 0.0, None, False, None)
    width, height = max(width, layout.width), max(height, layout.height)
    duration = layout.milliseconds / 1000
    return MediaInfo("animation", fmt, width, height, layout.frames, duration,
                     layout.frames / duration if duration else None, False, layout.loop)


@dataclass
class _Layout:
    frames: int = 0
    milliseconds: int = 0
    loop: int | None = None
    width: int = 0  # the largest extent of a frame (a frame may reach past the screen)
    height: int = 0


def _gif_layout(data: bytes) -> _Layout:
    """Count a GIF's frames and add up their durations from its blocks (no LZW decoding)."""
    layout = _Layout()
    flags = data[10]
    pos = 13 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0)
    delay: int | None = None
    end = len(data)
    while pos < end:
        block = data[pos]
        if block == 0x3B:  # trailer
            break
        if block == 0x21 and pos + 2 < end:  # extension
            label, pos = data[pos + 1], pos + 2
            if label == 0xF9 and data[pos] >= 4 and pos + 5 <= end:
                delay = 10 * struct.unpack_from("<H", data, pos + 2)[0]
            elif (label == 0xFF and data[pos] == 11 and data[pos + 1:pos + 12] == b"NETSCAPE2.0"
                  and pos + 16 <= end and data[pos + 12] >= 3 and data[pos + 13] == 1):
                layout.loop = struct.unpack_from("<H", data, pos + 14)[0]
            pos = _skip_sub_blocks(data, pos)
        elif block == 0x2C and pos + 10 <= end:  # image
            left, top, width, height, flags = struct.unpack_from("<HHHHB", data, pos + 1)
            layout.width = max(layout.width, left + width)
            layout.height = max(layout.height, top + height)
            layout.frames += 1
            layout.milliseconds += normal_duration(delay)
            delay = None
            pos += 10 + (3 * (2 << (flags & 7)) if flags & 0x80 else 0) + 1  # + LZW size
            pos = _skip_sub_blocks(data, pos)
        else:
            break  # garbage or a cut: Pillow stops reading here too
    return layout


def _skip_sub_blocks(data: bytes, pos: int) -> int:
    end = len(data)
    while pos < end:
        size = data[pos]
        pos += 1 + size
        if size == 0:
            break
    return pos


def _png_layout(data: bytes) -> _Layout:
    """An APNG's frames (acTL's count, or the fcTL chunks if more), durations and plays."""
    layout = _Layout()
    pos, end = 8, len(data)
    declared = None
    controls = 0
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        body = pos + 8
        if kind == b"acTL" and length >= 8 and body + 8 <= end:
            declared, layout.loop = struct.unpack_from(">II", data, body)
        elif kind == b"fcTL" and length >= 26 and body + 26 <= end:
            width, height, left, top, num, den = struct.unpack_from(">IIIIHH", data, body + 4)
            layout.width = max(layout.width, left + width)
            layout.height = max(layout.height, top + height)
            controls += 1
            layout.milliseconds += normal_duration(1000 * num / (den or 100))
        elif kind == b"IEND":
            break
        pos = body + length + 4
    if declared is None:
        return _Layout(frames=1)
    # Pillow decodes acTL's count (after a default image that is not a frame, which is
    # decoded but never converted: see _animation_frames); a count that understates the
    # chunks is held to the chunks
    layout.frames = max(declared, controls)
    return layout


def _webp_layout(data: bytes) -> _Layout:
    """An animated WebP's frames, durations and loop, from its RIFF chunks."""
    layout = _Layout()
    pos, end = 12, min(len(data), 8 + struct.unpack_from("<I", data, 4)[0])
    animated = False
    while pos + 8 <= end:
        kind, length = struct.unpack_from("<4sI", data, pos)
        body = pos + 8
        if kind == b"ANIM" and body + 6 <= end:
            animated = True
            layout.loop = struct.unpack_from("<H", data, body + 4)[0]
        elif kind == b"ANMF" and body + 16 <= end:
            fields = data[body:body + 16]
            left, top, width, height, duration = (
                2 * int.from_bytes(fields[0:3], "little"),
                2 * int.from_bytes(fields[3:6], "little"),
                1 + int.from_bytes(fields[6:9], "little"),
                1 + int.from_bytes(fields[9:12], "little"),
                int.from_bytes(fields[12:15], "little"))
            layout.width = max(layout.width, left + width)
            layout.height = max(layout.height, top + height)
            layout.frames += 1
            layout.milliseconds += normal_duration(duration)
        pos = body + length + (length & 1)
    return layout if animated else _Layout(frames=1)


_LAYOUTS = {"GIF": _gif_layout, "PNG": _png_layout, "WEBP": _webp_layout}


def _video_demuxer(data: bytes) -> str | None:
    """FFmpeg's demuxer for a video container, by its signature (None: not a video).
    Forcing the demuxer keeps FFmpeg from guessing among its hundreds of formats."""
    if data[4:8] == b"ftyp":
        return "mov"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "matroska"
    return None


def other_container(data: bytes) -> str | None:
    """The name of a video container that is not read (AVI, MPEG, FLV, ...), by its
    signature, so that its sender hears which containers are; None: not one of them."""
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "AVI"
    if data[:4] in (b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3"):
        return "MPEG"
    if not data.startswith(b"GIF") and len(data) > 564 and all(
            data[at] == 0x47 for at in range(0, 565, 188)):  # four 188-byte packets
        return "MPEG-TS"
    if data[:3] == b"FLV":
        return "FLV"
    if data[:4] == b"\x30\x26\xb2\x75":
        return "ASF/WMV"
    if data[:4] == b"OggS":
        return "Ogg"
    return None


def _open_video(data: bytes, demuxer: str, max_pixels: int | None = None) -> Any:
    """The container; ``max_pixels``: frames FFmpeg decodes while it opens the file (to
    find the streams' parameters) are refused over it before they are allocated."""
    import av

    options = {"probesize": "1000000", "analyzeduration": "1000000"}
    if max_pixels is not None:
        options["max_pixels"] = str(2 * max_pixels + (1 << 20))  # see _cap_pixels
    return av.open(io.BytesIO(data), format=demuxer, options=options)


def codec_name(stream: Any) -> str:
    """FFmpeg's name of ``stream``'s codec ("av1"), not of the decoder PyAV picked for it
    ("libdav1d"; "mp3float" for "mp3")."""
    return str(stream.codec_context.codec.canonical_name)


def _probe_video(data: bytes, demuxer: str, decode: DecodeLimits,
                 max_pixels: int) -> MediaInfo:
    if demuxer == "mov":
        fmt = "MOV" if data[8:12] == b"qt  " else "MP4"
    else:
        fmt = "WEBM" if b"webm" in data[:64] else "MKV"
    with decoding.failures("the video", lambda exc: decoding.corrupt(fmt, exc, MEDIA_HINT)), \
            _open_video(data, demuxer, max_pixels) as container:
        if not container.streams.video:
            raise BadImage(f"the {fmt} file has no video stream; {MEDIA_HINT}")
        stream = container.streams.video[0]
        codec = codec_name(stream)
        if codec not in VIDEO_CODECS:
            raise UnsupportedImage(f"{fmt} videos in {codec} are not accepted; "
                                   f"{MEDIA_HINT}")
        width, height = stream.codec_context.width, stream.codec_context.height
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else None
        if stream.duration is not None and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            duration = container.duration / 1_000_000
        else:
            duration = 0.0
        frames = int(stream.frames or 0)
        if not frames and fps and duration:
            frames = max(1, round(duration * fps))  # Matroska does not store a count
        has_audio = bool(container.streams.audio)
    if width < 1 or height < 1:
        raise BadImage(f"the {fmt} video's frames have no size; {MEDIA_HINT}")
    if fps is None and frames and duration:
        fps = frames / duration
    return MediaInfo("video", fmt, width, height, frames, duration, fps, has_audio, None)


def _cap_pixels(stream: Any, pixels: int) -> None:
    """Make FFmpeg refuse a frame far over ``pixels`` before it allocates it (a stream may
    grow in-band after a small header): a BadImage. FFmpeg counts its padded buffers, so
    the cap is looser; the exact limit is _Counter's."""
    stream.codec_context.options = {"max_pixels": str(2 * pixels + (1 << 20))}


#: Packets :func:`_video_rotation` reads at most for its first frame (a decoder's delay:
#: H.264 holds up to 16 frames back).
_ROTATION_PACKETS = 32


def _video_rotation(data: bytes, demuxer: str, info: MediaInfo) -> int:
    """The counter-clockwise rotation (degrees) that shows the video upright, from the display
    matrix FFmpeg attaches to decoded frames only: so the first frame is decoded, once the
    limits are held; 0 when none comes within :data:`_ROTATION_PACKETS`."""
    # a corrupt packet: frames() reports it where it is, as it did before this
    with contextlib.suppress(Exception), _open_video(data, demuxer) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1
        _cap_pixels(stream, info.width * info.height)
        stream.codec_context.skip_frame = "NONKEY"  # the first frame is a key frame
        for count, packet in enumerate(container.demux(stream)):
            for frame in stream.decode(packet):
                return round(frame.rotation or 0)
            if count >= _ROTATION_PACKETS:
                break
    return 0


# -- frames ----------------------------------------------------------------------------
def frames(data: bytes, info: MediaInfo, limits: MediaLimits, decode: DecodeLimits, *,
           size: int, square: bool = False, start: int = 0,
           skipped: Callable[[int], None] | None = None) -> Generator[Frame, None, None]:
    """The frames of ``data`` (as :func:`probe` found it) from index ``start``, decoded one
    at a time and fitted to ``size`` (those before ``start`` decoded, counted, passed to
    ``skipped`` by index, not fitted); raises BadImage, or ImageTooLarge when the file holds more than its header said and
    more than the limits allow."""
    if info.kind == "still":
        decoded = decoding.decode_upload(data, decode, size=size, square=square)
        yield Frame(0, decoded.image, DEFAULT_DURATION_MS, None, 0.0)
        return
    counter = _Counter(info, limits)
    source = _video_frames if info.kind == "video" else _animation_frames
    with decoding.failures(f"the {_name(info)}",
                           lambda exc: decoding.corrupt(info.format, exc, MEDIA_HINT)):
        yield from source(data, info, counter, size, square, _Skip(start, skipped))


class _Counter:
    """The limits again, frame by frame, against what the file really holds."""

    def __init__(self, info: MediaInfo, limits: MediaLimits) -> None:
        self.info, self.limits = info, limits
        self.pixels = 0

    def add(self, index: int, width: int, height: int, pts: float) -> None:
        limits, name = self.limits, _name(self.info)
        if index >= limits.max_frames:
            raise ImageTooLarge(f"the {name} has more than {limits.max_frames:,} frames (more "
                                "than its header says); send a shorter one")
        if pts > limits.max_seconds:
            raise ImageTooLarge(f"the {name} lasts more than {limits.max_seconds:g} s (more "
                                "than its header says); send a shorter one")
        if index + 1 > limits.max_fps * (pts + _FPS_GRACE_S):
            raise ImageTooLarge(f"the {name} has more than {limits.max_fps:g} frames a "
                                "second; send it at a lower frame rate")
        if width * height > limits.max_pixels:
            raise ImageTooLarge(f"a frame of the {name} is {width}x{height}, more than "
                                f"{limits.max_pixels:,} pixels; send a smaller one")
        self.add_pixels(width, height)

    def add_pixels(self, width: int, height: int) -> None:
        """Pixels decoded, frame or not, against the total."""
        limits, name = self.limits, _name(self.info)
        self.pixels += width * height
        if self.pixels > limits.max_total_pixels:
            raise ImageTooLarge(f"the {name} has more than {limits.max_total_pixels:,} "
                                "pixels in all; send a shorter or smaller one")


class _Skip:
    """Whether a frame comes before the first one asked for (decoded and counted only)."""

    def __init__(self, start: int, skipped: Callable[[int], None] | None) -> None:
        self.start, self.skipped = start, skipped

    def __call__(self, index: int) -> bool:
        if index >= self.start:
            return False
        if self.skipped is not None:
            self.skipped(index)
        return True


def _fitted(image: Image.Image, size: int, square: bool) -> Image.Image:
    """An RGB copy of a decoder's frame, fitted (never the decoder's own, reused canvas)."""
    plain = image.mode == "RGB" and not {"transparency", "icc_profile"} & set(image.info)
    # to_rgb clears the info of an image it returns as it is: the decoder's, here
    rgb = image if plain else decoding.to_rgb(image)
    fitted = decoding.fit(rgb, size, square=square)
    return fitted.copy() if fitted is image else fitted


def _animation_frames(data: bytes, info: MediaInfo, counter: _Counter, size: int,
                      square: bool, skip: _Skip) -> Iterator[Frame]:
    with Image.open(io.BytesIO(data), formats=(info.format,)) as image:
        pts = 0.0
        index = 0
        # an APNG's default image that is not part of the animation (shown only where APNG
        # is not understood) is Pillow's frame 0: decoded and counted, never a frame
        hidden = int(info.format == "PNG" and bool(image.info.get("default_image")))
        if hidden:
            counter.add_pixels(image.width, image.height)
            image.load()
        while True:
            if index + hidden:
                try:
                    image.seek(index + hidden)
                except EOFError:
                    return
            counter.add(index, image.width, image.height, pts)
            image.load()
            duration = normal_duration(image.info.get("duration"))
            disposal = (getattr(image, "disposal_method", None) if info.format == "GIF"
                        else image.info.get("disposal"))
            if not skip(index):
                yield Frame(index, _fitted(image, size, square), duration,
                            None if disposal is None else int(disposal), pts)
            pts += duration / 1000
            index += 1


_ROTATIONS = {90: Image.Transpose.ROTATE_90, -90: Image.Transpose.ROTATE_270,
              270: Image.Transpose.ROTATE_270, 180: Image.Transpose.ROTATE_180,
              -180: Image.Transpose.ROTATE_180}


def _video_frames(data: bytes, info: MediaInfo, counter: _Counter, size: int,
                  square: bool, skip: _Skip) -> Iterator[Frame]:
    demuxer = _video_demuxer(data)
    if demuxer is None:
        raise BadImage(f"the file is not a video; {MEDIA_HINT}")
    fps = info.fps or 25.0
    with _open_video(data, demuxer) as container:
        stream = container.streams.video[0]
        stream.thread_count = 1  # one frame in flight: the memory bound holds
        _cap_pixels(stream, counter.limits.max_pixels)
        start: float | None = None
        for index, frame in enumerate(container.decode(stream)):
            time = frame.time
            if time is None:
                time = index / fps
            if start is None:
                start = time
            pts = max(0.0, time - start)
            counter.add(index, frame.width, frame.height, pts)
            if skip(index):
                continue
            seconds = (float(frame.duration * frame.time_base)
                       if frame.duration and frame.time_base else 1 / fps)
            image = frame.to_image()
            turn = _ROTATIONS.get(round(frame.rotation or 0))
            if turn is not None:
                image = image.transpose(turn)
            yield Frame(index, decoding.fit(image, size, square=square),
                        normal_duration(1000 * seconds), None, pts)


# -- audio -----------------------------------------------------------------------------
#: Audio codecs an MP4 takes as they are (the packets copied); any other (Opus and Vorbis
#: from WebM, PCM from MOV) is transcoded to AAC, which every browser plays in an MP4.
MP4_AUDIO_COPIED = frozenset({"aac", "mp3", "alac", "ac3", "eac3"})
#: How far the audio may run past the video's end, in seconds.
AUDIO_OVERRUN_S = 1.0
#: Bytes of audio a second may bring (2 Mbit/s: lossless ALAC stereo fits, AAC and AC-3
#: take a third of it or less), plus a fixed allowance; each packet counts its index entry.
AUDIO_BYTES_PER_S = 256_000
AUDIO_FIXED_BYTES = 256 << 10
AUDIO_PACKET_BYTES = 32
#: Sample rates the AAC encoder takes; a transcoded track at another rate goes to 48 kHz.
_AAC_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000,
                        64000, 88200, 96000})
AAC_BIT_RATE = 128_000


def audio_budget(info: MediaInfo, limits: MediaLimits) -> tuple[float, int]:
    """How much audio :func:`audio` keeps of ``info``'s video: (seconds, bytes)."""
    seconds = min(info.duration_s, limits.max_seconds) + AUDIO_OVERRUN_S
    return seconds, int(AUDIO_BYTES_PER_S * seconds) + AUDIO_FIXED_BYTES


def audio(data: bytes, info: MediaInfo, limits: MediaLimits) -> AudioTrack | None:
    """The video's first audio stream as an :class:`AudioTrack`, cut :data:`AUDIO_OVERRUN_S`
    after the video and within :func:`audio_budget` (ImageTooLarge past it); damaged packets
    are left out (``complete`` False). None when there is no packet to keep."""
    if info.kind != "video" or not info.has_audio:
        return None
    demuxer = _video_demuxer(data)
    if demuxer is None:
        raise BadImage(f"the file is not a video; {MEDIA_HINT}")
    with decoding.failures("the video's audio", lambda exc: BadImage(
            f"the video's audio cannot be read ({exc.__class__.__name__})")), \
            _open_video(data, demuxer) as container:
        if not container.streams.audio:
            return None
        return _remux_audio(container, info, limits)


class _Track:
    """The M4A being made: packets in increasing dts (an out-of-order one is left out: the
    MP4 muxer refuses it), counted against the byte budget."""

    def __init__(self, out: Any, stream: Any, seconds: float, budget: int) -> None:
        self.out, self.stream, self.seconds, self.budget = out, stream, seconds, budget
        self.written = self.packets = 0
        self.last_dts: int | None = None
        self.complete = True

    def put(self, packet: Any) -> None:
        if self.last_dts is not None and packet.dts is not None and packet.dts <= self.last_dts:
            self.complete = False
            return
        self.last_dts = packet.dts
        self.written += packet.size + AUDIO_PACKET_BYTES
        if self.written > self.budget:
            raise ImageTooLarge(f"the video's audio holds more than {self.budget:,} bytes in "
                                f"its first {self.seconds:g} s; send it with a smaller audio "
                                "track")
        packet.stream = self.stream
        self.out.mux(packet)
        self.packets += 1


def _remux_audio(container: Any, info: MediaInfo, limits: MediaLimits) -> AudioTrack | None:
    import av.error

    source = container.streams.audio[0]
    codec = codec_name(source)
    time_base = source.time_base
    if not time_base:
        raise BadImage("the video's audio stream has no time base")
    # the frames count from the first video frame (see _video_frames): the audio moves too
    video = container.streams.video[0] if container.streams.video else None
    shift = 0
    if video is not None and video.start_time and video.time_base:
        shift = round(video.start_time * video.time_base / time_base)
    transcoded = codec not in MP4_AUDIO_COPIED
    buffer = io.BytesIO()
    out = av.open(buffer, "w", format="mp4")
    try:
        if transcoded:
            rate = source.codec_context.sample_rate or 48_000
            stream = out.add_stream("aac", rate=rate if rate in _AAC_RATES else 48_000,
                                    layout="mono" if source.codec_context.channels == 1
                                    else "stereo")
            stream.bit_rate = AAC_BIT_RATE
        else:
            stream = out.add_stream_from_template(source)
        track = _Track(out, stream, *audio_budget(info, limits))
        try:
            for packet in container.demux(source):
                if packet.dts is None:  # the demuxer's final empty packet
                    continue
                at = (packet.pts if packet.pts is not None else packet.dts) - shift
                if at * time_base > track.seconds:
                    break
                packet.dts -= shift
                if packet.pts is not None:
                    packet.pts -= shift
                if not transcoded:
                    track.put(packet)
                    continue
                try:
                    decoded = source.codec_context.decode(packet)
                except av.error.FFmpegError:
                    track.complete = False  # a packet its decoder refuses is left out
                    continue
                for frame in decoded:
                    for encoded in stream.encode(frame):
                        track.put(encoded)
        except av.error.FFmpegError:
            track.complete = False  # a damaged container: what came before is kept
        if transcoded:
            for encoded in stream.encode(None):
                track.put(encoded)
        out.close()
    except BaseException:
        with contextlib.suppress(Exception):
            out.close()
        raise
    if not track.packets:
        return None
    return AudioTrack(buffer.getvalue(), codec, transcoded, track.complete)
