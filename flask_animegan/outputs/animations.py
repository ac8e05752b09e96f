"""Converted frames out as the upload's kind (GIF, WebP, APNG, MP4 with its audio), and the
preview. Writers stream each frame to a temporary file, never holding the clip; they write
the containers themselves because Pillow's ``save_all`` keeps every frame and merges
identical ones. ``disposal`` is in the source format's numbering (``None``: "leave it")."""

from __future__ import annotations

import io
import logging
import os
import re
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import IO, TYPE_CHECKING, Protocol

import av
import av.error
import numpy as np
from PIL import GifImagePlugin, Image

from ..errors import ConversionError
from ..inputs.media import AUDIO_OVERRUN_S, MP4_AUDIO_COPIED, AudioTrack
from ..process import process_alive
from . import stills as formats
from .labels import ContentLabel, gif_extensions, mp4_xmp_box

if TYPE_CHECKING:
    from av.audio.stream import AudioStream
    from av.container import InputContainer, OutputContainer
    from av.packet import Packet
    from av.video.stream import VideoStream

    from ..inputs.media import MediaInfo
    from .segments import Segment

__all__ = ["AUDIO_OVERRUN_S", "AUDIO_TIMEOUT_S", "MP4_AUDIO_COPIED", "ApngWriter", "FrameWriter",
           "GifWriter", "Mp4Join", "Mp4Writer", "WebPWriter", "crf_for", "join", "mimetype_for",
           "preview",
           "read_track", "sweep_leftovers", "writer_for"]

log = logging.getLogger(__name__)

#: Seconds the helper may take to make a video's audio track.
AUDIO_TIMEOUT_S = 15.0
#: The MP4's video time base: whole ticks for every usual frame rate and every millisecond.
VIDEO_TIME_BASE = Fraction(1, 90_000)
#: The MP4's colours, tagged in its stream: BT.601's matrix in limited range, BT.709's
#: primaries and transfer. Untagged, a browser guesses by size and shifts colours; why
#: BT.601 and not BT.709: docs/benchmark.md, "Figures behind design choices".
MATRIX = 6  # AVCOL_SPC_SMPTE170M
SWS_MATRIX = 5  # SWS_CS_ITU601: the same matrix in libswscale's numbering
BT709 = 1  # AVCOL_PRI_BT709, AVCOL_TRC_BT709
LIMITED_RANGE = 1  # AVCOL_RANGE_MPEG
#: libx264's speed/size trade-off; its lookahead bounds the encoder's memory.
X264_PRESET = "faster"
#: No B-frames: with them libx264's output for the same frames varied from run to run in
#: one process (a resumed job would not match an uninterrupted one), and segments would
#: start decoding before their first frame. The cost in size: docs/benchmark.md.
X264_PARAMS = "bframes=0"


#: How an MP4 being written is named in the temp folder: the writer's pid follows it.
MP4_PREFIX = "animegan-"
_LEFTOVER = re.compile(r"animegan-(?:(\d+)-)?[^/]*\.mp4")


def sweep_leftovers(max_age: float, folder: str | None = None) -> int:
    """Delete the MP4s that runs which died left in the temp folder (``folder``): those of
    a pid that is gone, and any older than ``max_age`` seconds; how many were deleted."""
    folder = folder or tempfile.gettempdir()
    try:
        entries = [entry for entry in os.scandir(folder) if _LEFTOVER.fullmatch(entry.name)]
    except OSError:  # no temp folder to read: nothing to sweep
        return 0
    swept = 0
    for entry in entries:
        pid = _LEFTOVER.fullmatch(entry.name)[1]  # type: ignore[index]
        try:
            old = time.time() - entry.stat(follow_symlinks=False).st_mtime > max_age
            dead = pid is not None and int(pid) != os.getpid() and not process_alive(int(pid))
            if entry.is_file(follow_symlinks=False) and (old or dead):
                os.unlink(entry.path)
                swept += 1
        except OSError:  # gone meanwhile, or another user's
            continue
    if swept:
        log.warning("flask_animegan: deleted %d MP4s left in %s by runs that died", swept,
                    folder)
    return swept


class FrameWriter(Protocol):
    """Takes frames in order; ``finish`` returns the result, ``close`` drops an unfinished one."""

    def add(self, image: Image.Image, duration_ms: int, disposal: int | None, *,
            pts: float | None = None) -> None: ...

    def finish(self) -> bytes: ...

    def close(self) -> None: ...


def read_track(info: MediaInfo, read_audio: Callable[[], AudioTrack | None] | None,
               ) -> tuple[AudioTrack | None, str | None]:
    """A video's audio track and, when it cannot be kept, why (logged): unreadable audio
    is left out, the video converts without it."""
    if info.kind != "video" or not info.has_audio or read_audio is None:
        return None, None
    track, error = None, None
    try:
        track = read_audio()
        if track is None:
            error = "its audio stream holds no packet that could be read"
    except ConversionError as exc:
        error = str(exc)
    if error:
        log.warning("the MP4 is written without the source's audio: %s", error)
    elif track is not None and not track.complete:
        log.warning("the source's audio had damaged packets: the MP4 is written without them")
    return track, error


_MIMETYPES = {"GIF": "image/gif", "WEBP": "image/webp", "PNG": "image/apng"}


def mimetype_for(info: MediaInfo) -> str:
    """The MIME type of ``info``'s result: an MP4 for a video, else the animation's own."""
    if info.kind == "video":
        return "video/mp4"
    if info.kind != "animation":
        raise ValueError(f"no frame writer for a {info.kind}: stills take the photo path")
    if info.format not in _MIMETYPES:
        raise ValueError(f"no frame writer for {info.format} animations")
    return _MIMETYPES[info.format]


def writer_for(info: MediaInfo, *, quality: int,
               label: ContentLabel | None = None) -> tuple[FrameWriter, str]:
    """The writer of one segment of ``info``'s frames and the result's MIME type: a video's
    segment is an MP4 of its frames alone (:class:`Mp4Join` adds the audio and ``label``),
    an animation's is the whole result, with ``label``."""
    mimetype = mimetype_for(info)
    if info.kind == "video":
        return Mp4Writer(fps=info.fps, quality=quality), mimetype
    if info.format == "GIF":
        return GifWriter(loop=info.loop, label=label), mimetype
    if info.format == "WEBP":
        return WebPWriter(loop=info.loop, quality=quality, label=label), mimetype
    return ApngWriter(loop=info.loop, label=label), mimetype


def join(info: MediaInfo, segments: Sequence[Segment], audio: AudioTrack | None, *,
         audio_error: str | None = None, label: ContentLabel | None = None,
         overrun: float = AUDIO_OVERRUN_S) -> bytes:
    """The result of ``segments`` (in order, from the first): a video's joined into one MP4
    with ``audio`` (up to ``overrun`` s past the last frame) and ``label``; an animation's
    one segment is its whole result."""
    if not segments:
        raise ValueError("no segments to join")
    if info.kind == "video":
        return Mp4Join(audio, audio_error=audio_error, label=label).join(segments, overrun)
    if len(segments) != 1:
        raise ValueError(f"an animation is one segment, not {len(segments)}")
    return segments[0].data


def preview(image: Image.Image, quality: int, label: ContentLabel | None = None) -> bytes:
    """The job's preview still: a converted frame as JPEG, labelled as the result is."""
    return formats.encode(image.convert("RGB"), "jpeg", quality, label)


class _StreamedFile:
    """A writer's output: a temporary file, read once at the end."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by the writer
        self.frames = 0
        self.size: tuple[int, int] | None = None

    def check(self, image: Image.Image) -> None:
        if self.size is None:
            self.size = image.size
        elif image.size != self.size:
            raise ValueError(f"frame {self.frames} is {image.size}, the first was {self.size}")

    def read_all(self) -> bytes:
        try:
            if not self.frames:
                raise ValueError("no frames were added")
            self.file.seek(0)
            return self.file.read()
        finally:
            self.file.close()


class GifWriter:
    """GIF89a, a palette per frame, undithered so no pattern crawls; ``loop`` None: plays once."""

    def __init__(self, *, loop: int | None, label: ContentLabel | None = None) -> None:
        self._out = _StreamedFile()
        self._loop = loop
        self._label = label

    def add(self, image: Image.Image, duration_ms: int, disposal: int | None, *,
            pts: float | None = None) -> None:
        self._out.check(image)
        if not self._out.frames:
            self._out.file.write(self._header(*image.size))
        frame = image.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE,
                                               dither=Image.Dither.NONE)
        centiseconds = min(max(round(duration_ms / 10), 0), 0xFFFF)
        for part in GifImagePlugin.getdata(frame, duration=centiseconds * 10,
                                           disposal=min(max(disposal or 0, 0), 3),
                                           include_color_table=True):
            self._out.file.write(part)
        self._out.frames += 1

    def _header(self, width: int, height: int) -> bytes:
        # no global colour table: every frame brings its own
        header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0)
        if self._loop is not None:
            header += (b"!\xff\x0bNETSCAPE2.0\x03\x01"
                       + struct.pack("<H", min(max(self._loop, 0), 0xFFFF)) + b"\x00")
        if self._label is not None:
            header += gif_extensions(self._label)
        return header

    def finish(self) -> bytes:
        if self._out.frames:
            self._out.file.write(b";")
        return self._out.read_all()

    def close(self) -> None:
        self._out.file.close()


def _riff_chunks(data: bytes, start: int) -> Iterator[tuple[bytes, bytes]]:
    """(fourcc, payload) of the RIFF chunks from ``start``."""
    at = start
    while at + 8 <= len(data):
        fourcc, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        yield fourcc, data[at + 8:at + 8 + size]
        at += 8 + size + (size & 1)


def _riff_chunk(fourcc: bytes, payload: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(payload)) + payload + b"\0" * (len(payload) & 1)


def _u24(value: int) -> bytes:
    return struct.pack("<I", value)[:3]


class WebPWriter:
    """Animated WebP: each frame a lossy WebP still in its own ANMF chunk, no blending."""

    def __init__(self, *, loop: int | None, quality: int,
                 label: ContentLabel | None = None) -> None:
        self._out = _StreamedFile()
        self._loop = 0 if loop is None else min(max(loop, 0), 0xFFFF)
        self._quality = quality
        self._xmp = label.xmp() if label is not None else None

    def add(self, image: Image.Image, duration_ms: int, disposal: int | None, *,
            pts: float | None = None) -> None:
        self._out.check(image)
        width, height = image.size
        if not self._out.frames:
            # the RIFF size is patched by finish()
            flags = 0x02 | (0x04 if self._xmp else 0)  # animation; XMP (after the frames)
            self._out.file.write(b"RIFF\0\0\0\0WEBP"
                                 + _riff_chunk(b"VP8X", bytes([flags, 0, 0, 0]) + _u24(width - 1)
                                               + _u24(height - 1))
                                 + _riff_chunk(b"ANIM", b"\xff\xff\xff\xff"
                                               + struct.pack("<H", self._loop)))
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "WEBP", quality=self._quality, method=4)
        still = buffer.getvalue()
        bitstream = b"".join(_riff_chunk(fourcc, payload)
                             for fourcc, payload in _riff_chunks(still, 12)
                             if fourcc in (b"ALPH", b"VP8 ", b"VP8L"))
        flags = 0b10 | (1 if disposal == 1 else 0)  # do not blend; dispose to background
        self._out.file.write(_riff_chunk(
            b"ANMF", _u24(0) + _u24(0) + _u24(width - 1) + _u24(height - 1)
            + _u24(min(max(duration_ms, 0), 0xFFFFFF)) + bytes([flags]) + bitstream))
        self._out.frames += 1

    def finish(self) -> bytes:
        if self._out.frames and self._xmp:
            self._out.file.write(_riff_chunk(b"XMP ", self._xmp))
        size = self._out.file.tell()
        if self._out.frames:
            self._out.file.seek(4)
            self._out.file.write(struct.pack("<I", size - 8))
        return self._out.read_all()

    def close(self) -> None:
        self._out.file.close()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


class ApngWriter:
    """APNG: each frame's PNG encoding, the first as IDAT so viewers without APNG show it."""

    def __init__(self, *, loop: int | None, label: ContentLabel | None = None) -> None:
        self._out = _StreamedFile()
        self._loop = 0 if loop is None else max(loop, 0)
        self._xmp = label.xmp() if label is not None else None
        self._sequence = 0
        self._actl_at = 0

    def add(self, image: Image.Image, duration_ms: int, disposal: int | None, *,
            pts: float | None = None) -> None:
        self._out.check(image)
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "PNG", compress_level=3)
        still = buffer.getvalue()
        chunks: list[tuple[bytes, bytes]] = []
        at = 8
        while at + 8 <= len(still):
            length, kind = struct.unpack(">I4s", still[at:at + 8])
            chunks.append((kind, still[at + 8:at + 8 + length]))
            at += 12 + length
        file = self._out.file
        if not self._out.frames:
            file.write(still[:8] + b"".join(_png_chunk(k, p) for k, p in chunks if k == b"IHDR"))
            self._actl_at = file.tell()
            file.write(_png_chunk(b"acTL", struct.pack(">II", 0, self._loop)))
        width, height = image.size
        delay_num, delay_den = max(duration_ms, 0), 1000
        if delay_num > 0xFFFF:
            delay_num, delay_den = min(round(duration_ms / 10), 0xFFFF), 100
        dispose = disposal if disposal in (0, 1, 2) else 0
        file.write(_png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", self._next(), width, height,
                                                   0, 0, delay_num, delay_den, dispose, 0)))
        for kind, payload in chunks:
            if kind != b"IDAT":
                continue
            if self._out.frames:
                file.write(_png_chunk(b"fdAT", struct.pack(">I", self._next()) + payload))
            else:
                file.write(_png_chunk(b"IDAT", payload))
        self._out.frames += 1

    def _next(self) -> int:
        self._sequence += 1
        return self._sequence - 1

    def finish(self) -> bytes:
        file = self._out.file
        if self._out.frames:
            if self._xmp:  # iTXt: keyword, no compression, no language, no translation
                file.write(_png_chunk(b"iTXt", b"XML:com.adobe.xmp\0\0\0\0\0" + self._xmp))
            file.write(_png_chunk(b"IEND", b""))
            file.seek(self._actl_at)
            file.write(_png_chunk(b"acTL", struct.pack(">II", self._out.frames, self._loop)))
        return self._out.read_all()

    def close(self) -> None:
        self._out.file.close()


def crf_for(quality: int) -> int:
    """libx264's constant rate factor for a still-style ``quality`` (1-100)."""
    return min(max(round(54 - 0.4 * quality), 14), 40)


def _even(image: Image.Image) -> Image.Image:
    """YUV 4:2:0 needs even sides: an odd side repeats its last row or column."""
    width, height = image.size
    if not (width % 2 or height % 2):
        return image
    padded = Image.new("RGB", (width + width % 2, height + height % 2))
    padded.paste(image, (0, 0))
    if width % 2:
        padded.paste(image.crop((width - 1, 0, width, height)), (width, 0))
    if height % 2:
        padded.paste(padded.crop((0, height - 1, width + width % 2, height)), (0, height))
    return padded


class Mp4Writer:
    """One segment's MP4/H.264 at its frames' times from 0 s, video only: a segment opens
    with a keyframe, so segments join packet for packet. One libx264 thread: the cores are
    the model's."""

    def __init__(self, *, fps: float | None = None, quality: int) -> None:
        self._crf = crf_for(quality)
        self._rate = Fraction(fps).limit_denominator(1001) if fps and fps > 0 else Fraction(25)
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._out: OutputContainer | None = None
        self._video: VideoStream | None = None
        self._last_pts = self._next_pts = 0
        # each packet gets its own frame's duration, not libx264's one at the stream's rate
        self._durations: dict[int, int] = {}
        self._frames = 0

    def _open(self, width: int, height: int) -> None:
        out = av.open(self._file, "w", format="mp4")
        video = out.add_stream("libx264", rate=self._rate)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        context = video.codec_context
        context.time_base = VIDEO_TIME_BASE
        context.colorspace, context.color_range = MATRIX, LIMITED_RANGE
        context.color_primaries = context.color_trc = BT709
        context.thread_count = 1
        video.options = {"crf": str(self._crf), "preset": X264_PRESET,
                         "x264-params": X264_PARAMS}
        self._out, self._video = out, video

    def add(self, image: Image.Image, duration_ms: int, disposal: int | None, *,
            pts: float | None = None) -> None:
        image = _even(image.convert("RGB"))
        if self._out is None:
            self._open(*image.size)
        assert self._video is not None and self._out is not None
        if (image.width, image.height) != (self._video.width, self._video.height):
            raise ValueError(f"frame {self._frames} is {image.size}, the first was "
                             f"{(self._video.width, self._video.height)}")
        ticks = self._next_pts if pts is None else round(pts / VIDEO_TIME_BASE)
        if self._frames:
            ticks = max(ticks, self._last_pts + 1)  # presentation times only go forward
        duration = max(round(duration_ms / 1000 / VIDEO_TIME_BASE), 1)
        frame = av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24").reformat(
            format="yuv420p", dst_colorspace=SWS_MATRIX, dst_color_range=LIMITED_RANGE)
        frame.colorspace, frame.color_range = MATRIX, LIMITED_RANGE
        frame.pts, frame.time_base, frame.duration = ticks, VIDEO_TIME_BASE, duration
        self._last_pts, self._next_pts = ticks, ticks + duration
        self._durations[ticks] = duration
        self._frames += 1
        self._mux(self._video.encode(frame))

    def _mux(self, packets: list[Packet[VideoStream]]) -> None:
        assert self._out is not None
        for packet in packets:
            if packet.pts is not None and packet.pts in self._durations:
                packet.duration = self._durations.pop(packet.pts)
            self._out.mux(packet)

    def finish(self) -> bytes:
        try:
            if self._out is None or self._video is None:
                raise ValueError("no frames were added")
            self._mux(self._video.encode(None))
            self._out.close()
            self._out = None
            self._file.seek(0)
            return self._file.read()
        finally:
            self.close()

    def close(self) -> None:
        if self._out is not None:  # abandoned: whatever the file holds goes with it
            out, self._out = self._out, None
            try:
                out.close()
            except av.error.FFmpegError:
                pass
        self._file.close()


class Mp4Join:
    """Segments' MP4s joined packet for packet into the result (no frame encoded again),
    each placed at its start time, with the helper's audio track cut
    :data:`AUDIO_OVERRUN_S` after the last frame and the label."""

    def __init__(self, audio: AudioTrack | None, *, audio_error: str | None = None,
                 label: ContentLabel | None = None) -> None:
        self._label = label
        self._track = audio
        #: what became of the source's audio: "none", "copied", "transcoded" or "dropped"
        self.audio = "dropped" if audio_error else "none"
        self.audio_error = audio_error
        self.audio_codec = audio.codec if audio is not None else ""
        self._source: InputContainer | None = None
        self._in_audio: AudioStream | None = None
        self._packets: Iterator[Packet[AudioStream]] | None = None
        self._out_audio: AudioStream | None = None

    def _open_audio(self) -> None:
        if self._track is None:
            return
        try:  # the helper's own M4A: only a bug gets an error here
            self._source = av.open(io.BytesIO(self._track.data), "r")
            self._in_audio = self._source.streams.audio[0]
            self.audio = "transcoded" if self._track.transcoded else "copied"
        except (av.error.FFmpegError, IndexError) as exc:
            self.audio, self.audio_error = "dropped", f"its track could not be read ({exc})"
            log.warning("the MP4 is written without the source's audio: %s", self.audio_error)
            self._close_source()

    def join(self, segments: Sequence[Segment], overrun: float = AUDIO_OVERRUN_S) -> bytes:
        """The MP4 of ``segments`` in order (their frames' times kept, the audio's up to
        ``overrun`` s past the last one's end); ValueError for none or segments encoded
        unlike the first."""
        if not segments:
            raise ValueError("no segments to join")
        self._open_audio()
        # named: faststart (so browsers play it as it downloads) reopens it by name
        file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below
            prefix=f"{MP4_PREFIX}{os.getpid()}-", suffix=".mp4")
        out: OutputContainer | None = None
        try:
            out = av.open(file.name, "w", format="mp4", options={"movflags": "+faststart"})
            if self._label is not None:
                out.metadata.update(self._label.tags())
            video: VideoStream | None = None
            extradata: bytes | None = None
            last_dts: int | None = None
            for segment in segments:
                with av.open(io.BytesIO(segment.data), "r") as source:
                    stream = source.streams.video[0]
                    if video is None:
                        video = out.add_stream_from_template(stream)
                        extradata = stream.codec_context.extradata
                        if self._in_audio is not None:
                            self._out_audio = out.add_stream_from_template(self._in_audio)
                            self._packets = self._source.demux(  # type: ignore[union-attr]
                                self._in_audio)
                    elif stream.codec_context.extradata != extradata:
                        raise ValueError(f"segment {segment.index} was encoded unlike the "
                                         "first; it cannot be joined to it")
                    assert stream.time_base is not None
                    offset = round(segment.start_s / stream.time_base)
                    for packet in source.demux(stream):
                        if packet.dts is None or packet.pts is None:  # the final empty one
                            continue
                        packet.pts += offset
                        packet.dts += offset
                        if last_dts is not None and packet.dts <= last_dts:
                            packet.dts = last_dts + 1  # decoding order only goes forward
                            packet.pts = max(packet.pts, packet.dts)
                        last_dts = packet.dts
                        packet.stream = video
                        out.mux(packet)
                        self._pump_audio(out, float(packet.dts * stream.time_base))
            end = segments[-1].end_s
            self._pump_audio(out, end + overrun, limit=end + overrun)
            out.close()
            out = None
            file.seek(0)
            data = file.read()
            # XMP in a top-level box after the rest: faststart has put the index first
            return data + mp4_xmp_box(self._label) if self._label is not None else data
        finally:
            if out is not None:  # abandoned: whatever the file holds goes with it
                try:
                    out.close()
                except av.error.FFmpegError:
                    pass
            self._close_source()
            file.close()

    def _pump_audio(self, out: OutputContainer, until: float, limit: float | None = None,
                    ) -> None:
        """Mux audio up to ``until`` seconds; with a ``limit``, the rest up to it, then stop."""
        if self._packets is None:
            return
        assert self._out_audio is not None
        try:
            for packet in self._packets:
                if packet.dts is None:  # the demuxer's final empty packet
                    continue
                at = (float(packet.pts * packet.time_base)
                      if packet.pts is not None and packet.time_base is not None else until)
                if limit is not None and at > limit:
                    break
                packet.stream = self._out_audio
                out.mux(packet)
                if limit is None and at >= until:
                    return
        except av.error.FFmpegError as exc:  # the helper's M4A: only a bug gets here
            log.warning("the video's audio stopped early: %s", exc)
        self._packets = None

    def _close_source(self) -> None:
        if self._source is not None:
            source, self._source, self._in_audio = self._source, None, None
            source.close()
