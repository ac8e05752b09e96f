"""The job's writers (flask_animegan/outputs/animations.py): every kind of animation and video
written back out as its own kind, decoded again and compared with its source.

The frames are the source's own, decoded by flask_animegan.inputs.media, so each check is
about the writer: frame count, per-frame durations, loop and disposal (Pillow decodes the
animations), and for videos (PyAV decodes them) the frame times and duration within one
frame and the audio stream: present, the same duration within 50 ms and, when copied, the
same packets. A last class checks that memory stays flat however many frames are written.
"""

from __future__ import annotations

import io
import random
import re
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest
from PIL import Image

from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.inputs.isolation import POOL, Decoder
from flask_animegan.inputs.media import MediaLimits, frames, probe
from flask_animegan.outputs.animations import (
    AUDIO_OVERRUN_S,
    AUDIO_TIMEOUT_S,
    MP4_AUDIO_COPIED,
    ApngWriter,
    GifWriter,
    Mp4Join,
    Mp4Writer,
    WebPWriter,
    crf_for,
    join,
    preview,
    read_track,
    writer_for,
)
from flask_animegan.outputs.segments import Segment, segment_frames
from tests import media

LIMITS, DECODE = MediaLimits(), DecodeLimits()
DURATIONS = [20, 30, 50, 80, 100, 120, 200, 500, 1000, 70]


def _audio(source: bytes, info: Any, audio_timeout: float = AUDIO_TIMEOUT_S) -> Any:
    """The source's audio as the converter reads it: in the helper, within LIMITS."""
    return lambda: Decoder(media=LIMITS).audio(source, info, timeout=audio_timeout)


def rewrite(source: bytes, size: int = 96, quality: int = 90) -> tuple[Any, str, bytes]:
    """``source`` decoded frame by frame, written in segments and joined, as a job does:
    (the join, MIME type, bytes)."""
    info = probe(source, LIMITS, DECODE)
    return _write(source, info, list(frames(source, info, LIMITS, DECODE, size=size)),
                  quality=quality)


def _write(source: bytes, info: Any, frames_in: list[Any], quality: int = 90,
           **options: Any) -> tuple[Any, str, bytes]:
    """``frames_in`` in segments of ``info``'s length, each by its writer, then joined with
    the source's audio: (the join, whose ``audio`` says what became of it, MIME type, bytes)."""
    per = segment_frames(info)
    segments = []
    for first in range(0, len(frames_in), per):
        part = frames_in[first:first + per]
        writer, mimetype = writer_for(info, quality=quality)
        start = part[0].pts
        for frame in part:
            writer.add(frame.image, frame.duration_ms, frame.disposal, pts=frame.pts - start)
        last = part[-1]
        segments.append(Segment(first // per, first, len(part), 0, start,
                                last.pts + last.duration_ms / 1000, writer.finish()))
    track, error = read_track(info, _audio(source, info, **options))
    if info.kind != "video":
        return None, mimetype, join(info, segments, None)
    joining = Mp4Join(track, audio_error=error)
    return joining, mimetype, joining.join(segments)


def animation(data: bytes) -> dict[str, Any]:
    """What Pillow reads in an animation: format, loop, and each frame's duration, disposal
    and pixels."""
    with Image.open(io.BytesIO(data)) as image:
        found: dict[str, Any] = {"format": image.format, "frames": image.n_frames,
                                 "loop": image.info.get("loop"), "durations": [],
                                 "disposals": [], "pixels": []}
        for index in range(image.n_frames):
            image.seek(index)
            image.load()
            found["durations"].append(image.info.get("duration"))
            found["disposals"].append(getattr(image, "disposal_method", None)
                                      if image.format == "GIF" else image.info.get("disposal"))
            found["pixels"].append(np.asarray(image.convert("RGB"), dtype=np.int16))
    return found


def same_pictures(written: list[np.ndarray], source: list[np.ndarray], within: float) -> None:
    assert len(written) == len(source)
    for index, (a, b) in enumerate(zip(written, source)):
        assert a.shape == b.shape
        assert np.abs(a - b).mean() <= within, f"frame {index} is not the frame written"


# -- animations ---------------------------------------------------------------------------
#: (name, source): every animation kind with varied durations, loops and disposals
ANIMATIONS = [
    ("gif-varied", lambda: media.gif_from_photos(10, durations=DURATIONS, loop=0,
                                                 disposal=[0, 1, 2, 3, 1, 1, 2, 2, 0, 1])),
    ("gif-loop-3", lambda: media.gif_from_photos(10, durations=60, loop=3, disposal=1)),
    ("gif-once", lambda: media.gif_from_photos(6, durations=90, loop=None, disposal=0)),
    ("gif-60-frames", lambda: media.gif_from_photos(60, size=(64, 48), durations=40, loop=0)),
    ("gif-transparent", lambda: media.gif_from_photos(8, durations=70, transparency=True)),
    ("gif-odd-size", lambda: media.gif_from_photos(5, size=(75, 51), durations=100)),
    ("webp-varied", lambda: media.webp_animation(10, durations=DURATIONS, loop=0)),
    ("webp-loop-2", lambda: media.webp_animation(8, durations=45, loop=2)),
    ("webp-lossless", lambda: media.webp_animation(6, durations=150, lossless=True)),
    ("apng-varied", lambda: media.apng(10, durations=DURATIONS, loop=0,
                                       disposal=[0, 1, 2, 0, 1, 2, 0, 1, 2, 0])),
    ("apng-loop-4", lambda: media.apng(8, durations=33, loop=4, disposal=1, blend=1)),
    ("apng-odd-size", lambda: media.apng(5, size=(75, 51), durations=250)),
]
MIME = {"GIF": "image/gif", "WEBP": "image/webp", "PNG": "image/apng"}
#: mean absolute difference allowed per channel: GIF's 256 colours, WebP's lossy coding
WITHIN = {"GIF": 6.0, "WEBP": 6.0, "PNG": 0.0}


@pytest.mark.parametrize("name, make", ANIMATIONS, ids=[name for name, _ in ANIMATIONS])
def test_an_animation_comes_back_as_its_own_kind(name, make):
    source = make()
    before = animation(source)
    info = probe(source, LIMITS, DECODE)
    _, mimetype, written = rewrite(source)
    after = animation(written)
    assert mimetype == MIME[before["format"]]
    assert after["format"] == before["format"]
    assert after["frames"] == before["frames"] == info.frames
    assert after["durations"] == before["durations"]
    assert after["loop"] == before["loop"]
    if before["format"] != "WEBP":  # Pillow reads no disposal from WebP
        assert after["disposals"] == before["disposals"]
    # the frames themselves, as inputs.media composited them (alpha over white)
    composited = [np.asarray(frame.image, dtype=np.int16)
                  for frame in frames(source, info, LIMITS, DECODE, size=96)]
    same_pictures(after["pixels"], composited, WITHIN[before["format"]])
    again = probe(written, LIMITS, DECODE)
    assert (again.kind, again.format, again.frames, again.loop) == \
        ("animation", info.format, info.frames, info.loop)
    assert again.duration_s == pytest.approx(info.duration_s)


WRITERS = {"GIF": lambda: GifWriter(loop=0), "WEBP": lambda: WebPWriter(loop=0, quality=90),
           "PNG": lambda: ApngWriter(loop=0)}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_identical_frames_stay_frames(fmt):
    """A still shot (and every frame a job reuses) is as many frames as it was: Pillow's
    save_all would merge them into one longer frame."""
    still = next(media.camera_move(1, (96, 64)))
    moving = list(media.camera_move(3, (96, 64)))
    sequence = [still] * 7 + moving + [moving[-1]] * 4
    durations = [40 + 10 * index for index in range(len(sequence))]
    writer = WRITERS[fmt]()
    for image, duration in zip(sequence, durations):
        writer.add(image, duration, None)
    found = animation(writer.finish())
    assert found["frames"] == len(sequence)
    assert found["durations"] == durations
    same_pictures(found["pixels"], [np.asarray(i, dtype=np.int16) for i in sequence],
                  WITHIN[fmt])


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_long_and_zero_durations_are_written_as_given(fmt):
    """The writer keeps what it is given (inputs.media has already turned 0-10 ms into
    100 ms): 0 ms, a minute or more, and GIF's hundredths of a second rounded (Pillow reads
    a GIF frame of 0 ms, which has no delay block, as no duration)."""
    durations = [0, 70_000, 17, 24]
    expected = {"GIF": [None, 70_000, 20, 20]}.get(fmt, durations)
    writer = WRITERS[fmt]()
    for image, duration in zip(media.camera_move(4, (64, 48)), durations):
        writer.add(image, duration, None)
    found = animation(writer.finish())
    assert found["frames"] == 4
    assert found["durations"] == expected


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_writers_refuse_what_they_cannot_write(fmt):
    with pytest.raises(ValueError, match="no frames"):
        WRITERS[fmt]().finish()
    writer = WRITERS[fmt]()
    writer.add(Image.new("RGB", (64, 48)), 100, None)
    with pytest.raises(ValueError, match="the first was"):
        writer.add(Image.new("RGB", (48, 64)), 100, None)
    writer.close()
    writer.close()


def test_an_abandoned_video_writer_closes():
    """A failed or cancelled job closes its writer: nothing stays open (the suite turns an
    unclosed file into an error), a second close and a close after finish do nothing; a
    join of no segment, or of one that is no MP4, leaves nothing open either."""
    source = media.video_clip(0.5, 10)
    track = Decoder(timeout=20).audio(source, probe(source, LIMITS, DECODE))
    assert track is not None
    for frames_added in (0, 3):
        writer = Mp4Writer(fps=10, quality=80)
        for image in media.camera_move(frames_added, (96, 64)):
            writer.add(image, 100, None)
        writer.close()
        writer.close()
    writer = Mp4Writer(fps=10, quality=80)
    writer.add(next(media.camera_move(1, (96, 64))), 100, None)
    segment = Segment(0, 0, 1, 0, 0.0, 0.1, writer.finish())
    assert len(video(Mp4Join(track).join([segment]))["times"]) == 1
    writer.close()
    with pytest.raises(ValueError, match="no frames"):
        Mp4Writer(fps=10, quality=80).finish()
    with pytest.raises(ValueError, match="no segments"):
        Mp4Join(track).join([])
    with pytest.raises(av.error.FFmpegError):
        Mp4Join(track).join([Segment(0, 0, 1, 0, 0.0, 0.1, b"not an mp4")])


def test_a_still_has_no_frame_writer():
    source = media.video_clip(0.2, 10, audio=False)
    info = probe(source, LIMITS, DECODE)
    still = probe(_jpeg(), LIMITS, DECODE)
    with pytest.raises(ValueError, match="photo path"):
        writer_for(still, quality=90)
    writer, mimetype = writer_for(info, quality=90)
    writer.close()
    assert mimetype == "video/mp4"


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    media.photo().resize((96, 64)).save(buffer, "JPEG")
    return buffer.getvalue()


def test_the_preview_is_a_jpeg_of_the_frame():
    frame = next(media.camera_move(1, (96, 64)))
    data = preview(frame, 90)
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == "JPEG" and image.size == frame.size
        assert np.abs(np.asarray(image, dtype=np.int16)
                      - np.asarray(frame, dtype=np.int16)).mean() < 6


# -- videos --------------------------------------------------------------------------------
def video(data: bytes) -> dict[str, Any]:
    """What PyAV reads in a clip: the frame times and the end of the last frame (seconds),
    the size, and the audio stream's codec, packets and span."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        times, end = [], 0.0
        for frame in container.decode(stream):
            times.append(float(frame.time))
            step = (float(frame.duration * frame.time_base) if frame.duration
                    else 1 / float(stream.average_rate))
            end = max(end, float(frame.time) + step)
        found: dict[str, Any] = {"times": times, "end": end, "codec": stream.codec_context.name,
                                 "size": (stream.codec_context.width,
                                          stream.codec_context.height), "audio": None}
    with av.open(io.BytesIO(data)) as container:
        if container.streams.audio:
            sound = container.streams.audio[0]
            packets = [(bytes(p), float(p.pts * p.time_base), float(p.duration * p.time_base))
                       for p in container.demux(sound) if p.dts is not None]
            found["audio"] = {"codec": sound.codec_context.name, "packets": packets,
                              "start": min(t for _, t, _ in packets),
                              "end": max(t + d for _, t, d in packets)}
    return found


#: (container, fps, seconds, audio, size the frames are fitted to)
CLIPS = [
    ("mp4", 15, 2.0, True, 96),
    ("mp4", 24, 1.0, False, 96),
    ("mp4", Fraction(30000, 1001), 1.5, True, 71),  # odd fitted sides: padded to even
    ("mov", 25, 1.2, True, 96),
    ("webm", 15, 2.0, True, 96),  # Opus: transcoded to AAC
    ("webm", 30, 1.0, False, 64),
]


@pytest.mark.parametrize("container, fps, seconds, audio, size", CLIPS,
                         ids=[f"{c}-{float(f):g}fps-{s}s-{'audio' if a else 'silent'}-{z}px"
                              for c, f, s, a, z in CLIPS])
def test_a_video_comes_back_as_mp4_with_its_audio(container, fps, seconds, audio, size):
    source = media.video_clip(seconds, fps, container=container, audio=audio)
    writer, mimetype, written = rewrite(source, size=size)
    before, after = video(source), video(written)
    assert mimetype == "video/mp4"
    with av.open(io.BytesIO(written)) as out:
        assert out.format.name.startswith("mov,mp4")
    assert after["codec"] == "h264"
    assert all(side % 2 == 0 for side in after["size"])
    one_frame = 1 / float(fps)
    assert len(after["times"]) == len(before["times"])
    assert max(abs(a - b) for a, b in zip(after["times"], before["times"])) < one_frame / 2
    assert abs(after["end"] - before["end"]) <= one_frame
    if not audio:
        assert after["audio"] is None and writer.audio == "none"
        return
    source_audio, audio_out = before["audio"], after["audio"]
    assert audio_out is not None
    assert abs((audio_out["end"] - audio_out["start"])
               - (source_audio["end"] - source_audio["start"])) <= 0.050
    assert abs(audio_out["end"] - source_audio["end"]) <= 0.050
    if source_audio["codec"] in MP4_AUDIO_COPIED:
        assert writer.audio == "copied"
        assert audio_out["packets"] == source_audio["packets"]  # packet for packet
    else:
        assert (writer.audio, writer.audio_codec, audio_out["codec"]) == \
            ("transcoded", source_audio["codec"], "aac")
        assert _tone_level(written) > 0.1


def _tone_level(data: bytes) -> float:
    """The audio's RMS level: the source's tone is 0.3 peak (0.21 RMS), silence 0."""
    with av.open(io.BytesIO(data)) as container:
        samples = np.concatenate([frame.to_ndarray().ravel()
                                  for frame in container.decode(container.streams.audio[0])])
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2)))


def test_vorbis_from_webm_is_transcoded_to_aac():
    source = _clip(container="webm", video_codec="libvpx", audio_codec="vorbis",
                   video_seconds=1.0, audio_seconds=1.0)
    writer, _, written = rewrite(source)
    before, after = video(source), video(written)
    assert (writer.audio, writer.audio_codec, after["audio"]["codec"]) == \
        ("transcoded", "vorbis", "aac")
    assert abs(after["audio"]["end"] - before["audio"]["end"]) <= 0.050
    assert _tone_level(written) > 0.1


def test_the_mp4_index_comes_first():
    """faststart: the moov box before mdat, so a browser plays the result as it downloads."""
    written = rewrite(media.video_clip(0.5, 10))[2]
    boxes, at = [], 0
    while at + 8 <= len(written):
        size, kind = int.from_bytes(written[at:at + 4], "big"), written[at + 4:at + 8]
        boxes.append(kind)
        at += size
    assert boxes.index(b"moov") < boxes.index(b"mdat")


def test_audio_longer_than_the_video_is_cut_after_it():
    """A small upload with a long audio track cannot make a long result."""
    source = _clip(video_seconds=0.5, audio_seconds=4.0)
    _, _, written = rewrite(source)
    found = video(written)
    assert found["audio"]["end"] <= found["end"] + AUDIO_OVERRUN_S + 0.05
    assert found["audio"]["end"] >= found["end"]


def _clip(video_seconds: float, audio_seconds: float, container: str = "mp4",
          video_codec: str = "libx264", audio_codec: str = "aac", audio_pad: int = 0,
          audio_garble: int = 0) -> bytes:
    """A 10 fps clip whose audio may be longer than its video, in any codecs. Hostile audio:
    ``audio_pad`` seeded random bytes after each packet's own (a copy never decodes them),
    or every ``audio_garble``-th packet replaced by as many random bytes."""
    rng = random.Random(27)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(video_codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.options = {"preset": "ultrafast"} if video_codec == "libx264" else {}
        # FFmpeg's own Vorbis encoder (the wheel has no libvorbis) is experimental and stereo
        layout = "stereo" if audio_codec == "vorbis" else "mono"
        sound = out.add_stream(audio_codec, rate=media.AUDIO_RATE, layout=layout,
                               options={"strict": "experimental"})
        for index, image in enumerate(media.camera_move(round(video_seconds * 10))):
            frame = av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, 10)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
        tones = [_stereo(frame) if layout == "stereo" else frame
                 for frame in media._tone(audio_seconds, sound.codec_context.frame_size or 1024)]
        for index, packet in enumerate(p for tone in [*tones, None] for p in sound.encode(tone)):
            if audio_pad or (audio_garble and index % audio_garble == 0):
                body = (bytes(packet) + rng.randbytes(audio_pad) if audio_pad
                        else rng.randbytes(packet.size))
                hostile = av.Packet(body)
                hostile.pts, hostile.dts, hostile.duration = packet.pts, packet.dts, packet.duration
                hostile.time_base, hostile.stream = packet.time_base, sound
                packet = hostile
            out.mux(packet)
    return buffer.getvalue()


def _stereo(mono: av.AudioFrame) -> av.AudioFrame:
    samples = mono.to_ndarray()
    frame = av.AudioFrame.from_ndarray(np.concatenate([samples, samples]), format="fltp",
                                       layout="stereo")
    frame.sample_rate, frame.pts, frame.time_base = mono.sample_rate, mono.pts, mono.time_base
    return frame


def test_frames_without_times_follow_their_durations():
    """A caller that passes no pts gets each frame after the previous one's duration."""
    writer = Mp4Writer(fps=10, quality=80)
    for image in media.camera_move(6, (96, 64)):
        writer.add(image, 125, None)
    found = video(writer.finish())
    assert found["times"] == pytest.approx([0.125 * index for index in range(6)])
    assert found["end"] == pytest.approx(0.75)


#: Saturated colours, where BT.601's and BT.709's matrices differ most.
COLOURS = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (230, 200, 40)]
#: Kr and Kb of the matrix each FFmpeg colorspace value names (AVColorSpace).
MATRICES = {1: (0.2126, 0.0722), 5: (0.299, 0.114), 6: (0.299, 0.114)}


def mp4_of_colours(size: tuple[int, int]) -> bytes:
    """The colours in two segments, joined: the result's tags are the segments' own."""
    segments = []
    for index in range(2):
        writer = Mp4Writer(fps=4, quality=95)
        for colour in COLOURS[2 * index:2 * index + 2]:
            writer.add(Image.new("RGB", size, colour), 250, None)
        segments.append(Segment(index, 2 * index, 2, 0, 0.5 * index, 0.5 * index + 0.5,
                                writer.finish()))
    return Mp4Join(None).join(segments)


def shown(frame: av.VideoFrame, matrix: int, full_range: bool) -> tuple[int, ...]:
    """The mean colour of a 4:2:0 frame as a player shows it that reads the stream's own
    colour tags (``matrix``, ``full_range``), computed here from the planes."""
    planes = frame.to_ndarray(format="yuv420p").astype(np.float64)
    height = frame.height
    luma, chroma = planes[:height].mean(), planes[height:].reshape(2, -1).mean(axis=1)
    kr, kb = MATRICES[matrix]
    if full_range:
        y, cb, cr = luma, chroma[0] - 128, chroma[1] - 128
    else:
        y, cb, cr = (luma - 16) * 255 / 219, (chroma[0] - 128) * 255 / 224, (
            chroma[1] - 128) * 255 / 224
    red, blue = y + 2 * (1 - kr) * cr, y + 2 * (1 - kb) * cb
    green = (y - kr * red - kb * blue) / (1 - kr - kb)
    return tuple(round(value) for value in (red, green, blue))


@pytest.mark.parametrize("size", [(320, 240), (1280, 720)], ids=["SD", "HD"])
def test_an_mp4_states_its_colours_and_holds_them(size):
    """Untagged, a browser guesses the matrix by the size: Chromium showed an HD result
    with BT.709's while FFmpeg converted with BT.601's (green 30,200,30 as 16,174,29). The
    stream now says BT.601 (SMPTE 170M), limited range, BT.709 primaries and transfer, and
    its planes hold the frames' colours by that matrix."""
    with av.open(io.BytesIO(mp4_of_colours(size))) as container:
        stream = container.streams.video[0]
        context = stream.codec_context
        assert (context.colorspace, context.color_range) == (6, 1)
        assert (context.color_primaries, context.color_trc) == (1, 1)
        decoded = [shown(frame, context.colorspace, context.color_range == 2)
                   for frame in container.decode(stream)]
    assert len(decoded) == len(COLOURS)
    for got, want in zip(decoded, COLOURS, strict=True):
        assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 3, (got, want)


def test_quality_sets_the_rate_factor():
    assert [crf_for(q) for q in (100, 90, 75, 50, 1)] == [14, 18, 24, 34, 40]
    source = media.video_clip(1.0, 10, audio=False)
    sizes = [len(rewrite(source, quality=quality)[2]) for quality in (95, 40)]
    assert sizes[0] > sizes[1]


# -- memory ---------------------------------------------------------------------------------
def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


FLAT_FRAMES, FLAT_SIZE = 240, (256, 192)


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG", "MP4"])
def test_memory_stays_flat_however_many_frames(fmt):
    """240 frames of 256x192 are 35 MB as RGB images; a writer that kept them would grow by
    that much. After the first 40 frames (allocator and encoder warm-up) the process may grow
    by at most 8 MB while the other 200 are written."""
    writer = (Mp4Writer(fps=25, quality=80) if fmt == "MP4"
              else WRITERS[fmt]())
    frame_bytes = FLAT_SIZE[0] * FLAT_SIZE[1] * 3
    peak = base = 0
    for index, image in enumerate(media.camera_move(FLAT_FRAMES, FLAT_SIZE)):
        writer.add(image, 40, None, pts=index * 0.04)
        if index == 40:
            base = _rss()
        elif index > 40:
            peak = max(peak, _rss())
    assert peak - base < 8 << 20, (
        f"grew by {(peak - base) / frame_bytes:.0f} frames' worth over {FLAT_FRAMES - 41}")
    written = writer.finish()
    count = len(video(written)["times"]) if fmt == "MP4" else animation(written)["frames"]
    assert count == FLAT_FRAMES


# -- the audio comes from the helper's track, never from the upload ------------------------
def test_the_writer_never_opens_the_upload(monkeypatch):
    """Every container this process opens while a video with audio is written is the
    helper's track or the writer's own output: the upload's bytes are read in the helper."""
    source = media.video_clip(1.0, 10)
    info = Decoder(timeout=20).probe(source)
    frames_in = list(Decoder(timeout=20).frames(source, info, size=96))
    opened: list[bytes] = []
    real_open = av.open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, io.BytesIO):
            opened.append(file.getvalue())
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(av, "open", spy)
    writer, _, written = _write(source, info, frames_in)
    assert writer.audio == "copied"
    assert opened and source not in opened
    assert all(data[4:8] == b"ftyp" and len(data) < len(source) for data in opened)
    assert video(written)["audio"]["packets"] == video(source)["audio"]["packets"]


#: a hostile audio track: (name, clip, writer_for options, what the log says)
HOSTILE_AUDIO = [
    ("over-its-bytes", lambda: _clip(1.0, 1.0, audio_pad=60_000), {},
     "without the source's audio: .*audio holds more than"),
    ("past-its-time", lambda: media.video_clip(1.0, 10, container="webm"),
     {"audio_timeout": 0.0}, "without the source's audio: .*audio took more than"),
    ("all-packets-garbled", lambda: _clip(1.0, 1.0, container="webm", video_codec="libvpx",
                                          audio_codec="libopus", audio_garble=1),
     {}, "without the source's audio|without them"),
]


@pytest.mark.parametrize("name, make, options, logged", HOSTILE_AUDIO,
                         ids=[name for name, *_ in HOSTILE_AUDIO])
def test_a_hostile_audio_track_costs_the_audio_not_the_video(name, make, options, logged,
                                                               caplog):
    """The helper refuses the track (or is killed past its time): the video converts
    without it, frame for frame, and the log says so."""
    source = make()
    info = probe(source, LIMITS, DECODE)
    frames_in = list(frames(source, info, LIMITS, DECODE, size=96))
    killed = POOL.killed
    with caplog.at_level("WARNING", logger="flask_animegan.outputs.animations"):
        writer, _, written = _write(source, info, frames_in, **options)
    assert re.search(logged, caplog.text), caplog.text
    assert POOL.killed == killed + ("audio_timeout" in options)
    after = video(written)
    assert len(after["times"]) == len(frames_in) == info.frames
    if writer.audio == "dropped":
        assert writer.audio_error and after["audio"] is None
    else:  # garbled Opus the decoder conceals: what it kept, within its time
        assert after["audio"]["end"] <= after["end"] + AUDIO_OVERRUN_S + 0.05
