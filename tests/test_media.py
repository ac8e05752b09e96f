"""What an upload is and its frames (flask_animegan.inputs.media), in this process and in
the isolated helper (inputs.helper): every format round trip, the limits refused
with 413 before or while decoding, and generated corrupt inputs for every format."""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import re
import struct
from collections import Counter

import media as clips
import pytest
from PIL import Image
from upload_variants import bit_flips, prefixes

from flask_animegan.errors import BadImage, ImageTooLarge, Overloaded, UnsupportedImage
from flask_animegan.inputs import media
from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.inputs.isolation import POOL, Decoder
from flask_animegan.inputs.media import MediaInfo, MediaLimits

LIMITS, DECODE = MediaLimits(), DecodeLimits()
EXPECTED = (BadImage, UnsupportedImage, ImageTooLarge)
DURATIONS = [40, 50, 60, 70, 80, 90, 100, 110, 120, 130]


def helper_decoder(limits: MediaLimits = LIMITS, *, timeout: float = 20,
                   memory: int | None = None) -> Decoder:
    """A decoder that reads in the helper process."""
    return Decoder(limits=DECODE, media=limits, isolation="process", timeout=timeout,
                   memory=memory)


def probe_and_frames(data: bytes, isolated: bool, limits: MediaLimits = LIMITS,
                     size: int = 64, square: bool = False) -> tuple[MediaInfo, list[media.Frame]]:
    if isolated:
        info = helper_decoder(limits).probe(data)
        return info, list(helper_decoder(limits).frames(data, info, size=size, square=square,
                                                       total_timeout=60))
    info = media.probe(data, limits, DECODE)
    return info, list(media.frames(data, info, limits, DECODE, size=size, square=square))


# -- every format round trip ----------------------------------------------------------------
ANIMATIONS = {
    "gif": lambda: clips.gif_from_photos(durations=DURATIONS, loop=3, disposal=2),
    "gif-once": lambda: clips.gif_from_photos(durations=DURATIONS, loop=None, disposal=1,
                                              transparency=True),
    "webp": lambda: clips.webp_animation(durations=DURATIONS, loop=2),
    "apng": lambda: clips.apng(durations=DURATIONS, loop=0, disposal=1),
}
FORMAT = {"gif": "GIF", "gif-once": "GIF", "webp": "WEBP", "apng": "PNG"}
LOOP = {"gif": 3, "gif-once": None, "webp": 2, "apng": 0}


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("name", sorted(ANIMATIONS))
def test_animation_round_trip(name, isolated):
    data = ANIMATIONS[name]()
    info, frames = probe_and_frames(data, isolated)
    assert (info.kind, info.format, info.width, info.height) == (
        "animation", FORMAT[name], 96, 64)
    assert info.frames == len(frames) == Image.open(__import__("io").BytesIO(data)).n_frames
    assert info.loop == LOOP[name]
    assert info.duration_s == pytest.approx(sum(DURATIONS) / 1000)
    assert not info.has_audio
    assert [f.duration_ms for f in frames] == DURATIONS
    assert [f.index for f in frames] == list(range(10))
    assert [f.pts for f in frames] == pytest.approx(
        [sum(DURATIONS[:i]) / 1000 for i in range(10)])
    assert all(f.image.mode == "RGB" and f.image.size == (64, 43) for f in frames)
    if name.startswith("gif"):
        assert {f.disposal for f in frames} == {2 if name == "gif" else 1}
    elif name == "apng":
        assert {f.disposal for f in frames} == {1}
    # the camera moves: no two consecutive frames are the same picture
    assert all(a.image.tobytes() != b.image.tobytes() for a, b in itertools.pairwise(frames))


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_an_apng_default_image_that_is_not_a_frame_is_not_converted(isolated):
    """APNG viewers never show such a default image (it is for viewers that only read
    PNG): it was converted as a 100 ms first frame."""
    import io

    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (220, 220, 220)]
    red, *shown = [Image.new("RGB", (96, 64), colour) for colour in colours]
    buffer = io.BytesIO()
    red.save(buffer, "PNG", save_all=True, append_images=shown, default_image=True,
             duration=[40, 50, 60, 70], loop=0)  # Pillow times the 3 frames only
    info, frames = probe_and_frames(buffer.getvalue(), isolated)
    assert (info.kind, info.frames, len(frames)) == ("animation", 3, 3)
    assert info.duration_s == pytest.approx(0.15)
    assert [f.index for f in frames] == [0, 1, 2]
    assert [f.duration_ms for f in frames] == [40, 50, 60]
    assert [f.pts for f in frames] == pytest.approx([0, 0.04, 0.09])
    assert [f.image.getpixel((10, 10)) for f in frames] == colours[1:]


def test_transparent_gif_frames_are_over_white():
    _, frames = probe_and_frames(clips.gif_from_photos(transparency=True), False, size=96)
    corner = frames[3].image.getpixel((1, 1))
    assert corner == (255, 255, 255)


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("audio", [True, False], ids=["audio", "silent"])
@pytest.mark.parametrize("container", ["mp4", "mov", "webm"])
def test_video_round_trip(container, audio, isolated):
    data = clips.video_clip(seconds=1.2, fps=10, container=container, audio=audio)
    info, frames = probe_and_frames(data, isolated)
    assert (info.kind, info.format, info.width, info.height) == (
        "video", container.upper(), 96, 64)
    assert info.has_audio is audio
    assert info.frames == len(frames) == 12
    assert info.fps == pytest.approx(10)
    assert info.duration_s == pytest.approx(1.2, abs=0.11)
    assert info.loop is None
    assert [f.duration_ms for f in frames] == [100] * 12
    assert [f.pts for f in frames] == pytest.approx([i / 10 for i in range(12)])
    assert all(f.image.mode == "RGB" and f.image.size == (64, 43) for f in frames)


def test_square_styles_get_the_centre_square():
    _, frames = probe_and_frames(clips.video_clip(audio=False), False, size=48, square=True)
    assert {f.image.size for f in frames} == {(48, 48)}


def test_static_shot_frames_are_the_same_photo_by_the_cache_rule():
    """The frame-skipping measurement's clip: its static shot decodes to frames the
    cache's rule calls the same photo, the pan after it to frames it does not."""
    from flask_animegan.cache.near_duplicate import Fingerprint

    # at x264's default quality (crf 23) the encoder refines a static picture frame by
    # frame by more than the rule allows; at 6 it does not
    _, frames = probe_and_frames(clips.video_clip(seconds=2, fps=10, size=(128, 96),
                                                  static_seconds=1, crf=6), False, size=128)
    prints = [Fingerprint.of(frame.image) for frame in frames]
    same = [a.same_photo(b, 6) for a, b in itertools.pairwise(prints)]
    assert same[:9] == [True] * 9
    assert same[10:] == [False] * 9


def test_a_still_is_a_still():
    still = clips.gif_from_photos(n=1)
    info = media.probe(still, LIMITS, DECODE)
    assert (info.kind, info.frames) == ("still", 1)
    frames = list(media.frames(still, info, LIMITS, DECODE, size=64))
    assert len(frames) == 1 and frames[0].image.size == (64, 43)


def test_durations_of_10_ms_or_less_are_100_ms():
    """As browsers show GIFs: 0 and 10 ms become 100 ms, 20 ms stays (every format)."""
    given = [0, 10, 20, 0, 30]
    for data in (clips.gif_from_photos(n=5, durations=given),
                 clips.webp_animation(n=5, durations=given),
                 clips.apng(n=5, durations=given)):
        info, frames = probe_and_frames(data, False)
        assert [f.duration_ms for f in frames] == [100, 100, 20, 100, 30]
        assert info.duration_s == pytest.approx(0.35)


#: An encoder for each codec in media.VIDEO_CODECS: (encoder, container, pixel format).
CODEC_CLIPS = {
    "h264": ("libx264", "mp4", "yuv420p"),
    "hevc": ("libx265", "mp4", "yuv420p"),
    "vp8": ("libvpx", "webm", "yuv420p"),
    "vp9": ("libvpx-vp9", "webm", "yuv420p"),
    "av1": ("libsvtav1", "mp4", "yuv420p"),
    "mpeg4": ("mpeg4", "mp4", "yuv420p"),
    "mjpeg": ("mjpeg", "mov", "yuvj420p"),
    "prores": ("prores", "mov", "yuv422p10le"),
}


def test_every_accepted_codec_has_a_round_trip_below():
    assert set(CODEC_CLIPS) == media.VIDEO_CODECS


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("codec", sorted(CODEC_CLIPS))
def test_every_accepted_codec_is_probed_and_decoded(codec, isolated):
    """Checked by FFmpeg's name of the codec, not of the decoder PyAV picks for it: AV1
    is decoded by libdav1d, and was refused as "videos in libdav1d" while the message
    listed AV1."""
    encoder, container, pix_fmt = CODEC_CLIPS[codec]
    make = clips.isolated_clip if encoder in clips.THREADED_ENCODERS else clips.video_clip
    data = make(seconds=0.6, fps=10, container=container, audio=False, codec=encoder,
                pix_fmt=pix_fmt)
    info, frames = probe_and_frames(data, isolated)
    assert (info.kind, info.width, info.height) == ("video", 96, 64)
    assert info.frames == len(frames) == 6
    assert all(f.image.mode == "RGB" and f.image.size == (64, 43) for f in frames)


@pytest.mark.parametrize("container", ["avi", "mpeg", "mpegts", "flv", "asf"])
def test_a_video_in_a_container_that_is_not_read_is_415_naming_those_that_are(container):
    data = clips.video_clip(seconds=0.5, fps=10, container=container, audio=False)
    with pytest.raises(UnsupportedImage, match=r"videos are not accepted; .*MP4, WebM or MOV"):
        media.probe(data, LIMITS, DECODE)


def test_a_file_that_is_nothing_readable_names_what_a_job_takes():
    with pytest.raises(BadImage, match=re.escape(media.MEDIA_HINT)):
        media.probe(b"%PDF-1.7\n" + bytes(200), LIMITS, DECODE)


def test_an_unsupported_video_codec_is_415():
    with pytest.raises(UnsupportedImage, match="png"):
        media.probe(clips.video_clip(container="mov", codec="png", audio=False), LIMITS,
                    DECODE)


def _rotated_clip(degrees: int, container: str, frames: int = 3,
                  size: tuple[int, int] = (96, 64)) -> tuple[bytes, Image.Image]:
    """A clip of ``frames`` copies of a photo (``size`` as coded) whose display matrix says
    turn it ``degrees`` counter-clockwise to show it (as a phone writes it), and the photo."""
    import io
    from fractions import Fraction

    import av

    source = clips.photo("astronaut").resize(size)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = *size, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "12"}
        stream.set_display_rotation(degrees)
        for index in range(frames):
            frame = av.VideoFrame.from_image(source)
            frame.pts, frame.time_base = index, Fraction(1, 10)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buffer.getvalue(), source


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("container", ["mp4", "mov", "matroska"])
@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_a_rotated_video_is_probed_and_decoded_upright(degrees, container, isolated):
    """A phone's video: coded 96x64 with a display matrix of 90/180/270 degrees. The probe
    says the size it is shown at, and every frame is the source turned as players show it
    (numpy's rot90 of the source, counter-clockwise), within the codec's noise."""
    import numpy as np

    data, source = _rotated_clip(degrees, container)
    info, frames = probe_and_frames(data, isolated, size=96)
    shown = (64, 96) if degrees in (90, 270) else (96, 64)
    assert (info.width, info.height) == shown
    assert len(frames) == 3 and {f.image.size for f in frames} == {shown}
    expected = np.rot90(np.asarray(source, dtype=np.int16), k=degrees // 90)
    for frame in frames:
        error = np.abs(np.asarray(frame.image, dtype=np.int16) - expected).mean()
        assert error < 6, (degrees, error)
    # and the other turns are far off: the comparison tells them apart
    wrong = np.rot90(np.asarray(source, dtype=np.int16), k=(degrees // 90 + 2) % 4)
    assert np.abs(np.asarray(frames[0].image, dtype=np.int16) - wrong).mean() > 20


def test_a_rotated_video_is_held_to_the_same_limits():
    """The pixel and aspect limits are the same for the coded and the shown size; a
    frame-count limit is still refused before decoding."""
    data, _ = _rotated_clip(90, "mp4", frames=12, size=(128, 16))
    info = media.probe(data, LIMITS, DECODE)
    assert (info.width, info.height) == (16, 128)
    with pytest.raises(ImageTooLarge, match="one side"):
        media.probe(data, LIMITS, DecodeLimits(max_aspect=4.0))
    with pytest.raises(ImageTooLarge, match="pixels"):
        media.probe(data, MediaLimits(max_pixels=2000), DECODE)
    with pytest.raises(ImageTooLarge, match="frames"):
        media.probe(data, MediaLimits(max_frames=10), DECODE)


# -- limits: 413 before decoding (from the header), or while decoding -------------------
def _gif_screen(width: int, height: int, frames: int = 2) -> bytes:
    """A GIF with a huge logical screen holding ``frames`` 1x1 frames."""
    screen = struct.pack("<HHBBB", width, height, 0, 0, 0)
    frame = (b"\x21\xf9\x04\x00\x0a\x00\x00\x00" + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0)
             + b"\x02\x02\x44\x01\x00")
    return b"GIF89a" + screen + frame * frames + b"\x3b"


def _webp_canvas(data: bytes, width: int, height: int) -> bytes:
    """An animated WebP with its VP8X canvas set to ``width`` x ``height``."""
    at = data.index(b"VP8X") + 8 + 4
    return (data[:at] + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
            + data[at + 6:])


def _webm_duration(data: bytes, seconds: float) -> bytes:
    """A WebM whose header says it lasts ``seconds`` (Matroska stores no frame count)."""
    at = data.index(b"\x44\x89")
    assert data[at + 2] == 0x88  # an 8-byte float, in TimecodeScale units (ms)
    return data[:at + 3] + struct.pack(">d", seconds * 1000) + data[at + 11:]


def _apng_declared(data: bytes, count: int) -> bytes:
    at = data.index(b"acTL") + 4
    import zlib
    body = struct.pack(">II", count, 0)
    return data[:at] + body + struct.pack(">I", zlib.crc32(b"acTL" + body)) + data[at + 12:]


BEFORE = {
    # name: (file, limits, what the message says)
    "frames-gif": (lambda: clips.gif_from_photos(n=12), MediaLimits(max_frames=10), "frames"),
    "frames-webp": (lambda: clips.webp_animation(n=12), MediaLimits(max_frames=10), "frames"),
    "frames-apng": (lambda: clips.apng(n=12), MediaLimits(max_frames=10), "frames"),
    "frames-mp4": (lambda: clips.video_clip(1.2), MediaLimits(max_frames=10), "frames"),
    "frames-apng-header": (lambda: _apng_declared(clips.apng(n=3), 10**6), LIMITS, "frames"),
    "seconds-gif": (lambda: clips.gif_from_photos(n=4, durations=100_000), LIMITS, "lasts"),
    "seconds-mov": (lambda: clips.video_clip(2, container="mov"), MediaLimits(max_seconds=1.5),
                    "lasts"),
    "seconds-webm": (lambda: _webm_duration(clips.video_clip(1, container="webm"), 3600),
                     MediaLimits(max_frames=10**6, max_total_pixels=10**12), "lasts"),
    "fps-1000-mp4": (lambda: clips.video_clip(0.05, fps=1000, audio=False), LIMITS,
                     "frames a second"),
    "fps-apng-11ms": (lambda: clips.apng(n=12, durations=11), LIMITS, "frames a second"),
    "pixels-gif-screen": (lambda: _gif_screen(3000, 3000), LIMITS, "pixels|screen"),
    "pixels-webp-canvas": (lambda: _webp_canvas(clips.webp_animation(n=3), 3000, 2000), LIMITS,
                           "pixels"),
    "pixels-mp4": (lambda: clips.video_clip(0.2, fps=10, size=(2800, 1600), audio=False), LIMITS,
                   "pixels"),
    "total-pixels-webm": (lambda: clips.video_clip(1, container="webm"),
                          MediaLimits(max_total_pixels=50_000), "in all"),
}


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("name", sorted(BEFORE))
def test_over_a_limit_is_413_before_decoding(name, isolated):
    make, limits, message = BEFORE[name]
    data = make()
    with pytest.raises(ImageTooLarge, match=message):
        if isolated:
            helper_decoder(limits).probe(data)
        else:
            media.probe(data, limits, DECODE)


def test_zero_durations_are_not_a_frame_rate():
    """A GIF of 0 ms frames plays at 10 fps (100 ms each): accepted, not 'infinite fps'."""
    info, frames = probe_and_frames(clips.gif_from_photos(n=30, durations=0), False)
    assert info.fps == pytest.approx(10) and len(frames) == 30
    assert {f.duration_ms for f in frames} == {100}


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_a_header_that_lies_stops_at_the_limit_while_decoding(isolated):
    """A WebM whose header says 0.1 s (one frame) holds 20 frames: the probe passes, the
    decode stops with 413 at the limit, after max_frames frames."""
    data = _webm_duration(clips.video_clip(2, fps=10, container="webm", audio=False), 0.1)
    limits = MediaLimits(max_frames=8)
    seen = []
    with pytest.raises(ImageTooLarge, match="more than 8 frames"):
        if isolated:
            info = helper_decoder(limits).probe(data)
            assert info.frames == 1
            for frame in helper_decoder(limits).frames(data, info, size=64):
                seen.append(frame.index)
        else:
            info = media.probe(data, limits, DECODE)
            assert info.frames == 1
            for frame in media.frames(data, info, limits, DECODE, size=64):
                seen.append(frame.index)
    assert seen == list(range(8))


def test_a_header_that_lies_about_time_stops_while_decoding():
    data = _webm_duration(clips.video_clip(3, fps=10, container="webm", audio=False), 0.1)
    limits = MediaLimits(max_seconds=1.0)
    info = media.probe(data, limits, DECODE)
    with pytest.raises(ImageTooLarge, match="more than 1 s"):
        list(media.frames(data, info, limits, DECODE, size=64))


# -- the isolated helper's own limits ----------------------------------------------------
def test_a_slow_frame_kills_the_helper_with_413():
    data = clips.video_clip(1, audio=False)
    info = media.probe(data, LIMITS, DECODE)
    killed = POOL.killed
    with pytest.raises(ImageTooLarge, match="for one frame"):
        list(helper_decoder(timeout=0.0).frames(data, info, size=64))
    assert POOL.killed == killed + 1


def test_the_total_time_limit_counts_only_the_wait_for_frames():
    data = clips.video_clip(1, audio=False)
    info = media.probe(data, LIMITS, DECODE)
    with pytest.raises(ImageTooLarge, match="in all"):
        list(helper_decoder().frames(data, info, size=64, total_timeout=0.0))
    # a consumer that takes its time is not the decode's time
    frames = []
    for frame in helper_decoder().frames(data, info, size=64, total_timeout=10):
        frames.append(frame)
        __import__("time").sleep(0.05)
    assert len(frames) == 10


def test_a_decode_over_the_memory_limit_is_413_not_a_crash():
    """The address-space limit: 4 MiB above what the helper holds is not enough for a
    2800x1600 frame, so FFmpeg's or Pillow's allocation fails inside the helper."""
    data = clips.video_clip(0.2, fps=10, size=(1600, 1200), audio=False)
    info = media.probe(data, LIMITS, DECODE)
    with pytest.raises(ImageTooLarge, match="memory"):
        list(helper_decoder(timeout=20, memory=4 << 20).frames(data, info, size=64))
    # and the next request gets a working helper
    assert len(probe_and_frames(clips.video_clip(0.3, audio=False), True)[1]) == 3


def test_a_consumer_that_stops_early_leaves_no_helper_behind():
    data = clips.video_clip(1, audio=False)
    info = media.probe(data, LIMITS, DECODE)
    killed = POOL.killed
    stream = helper_decoder().frames(data, info, size=64)
    next(stream)
    stream.close()
    assert POOL.killed == killed + 1


# -- generated corrupt inputs: only the three errors, never another, never a hang --------
SMALL = {
    "gif": lambda: clips.gif_from_photos(n=4, size=(32, 24)),
    "webp": lambda: clips.webp_animation(n=4, size=(32, 24)),
    "apng": lambda: clips.apng(n=4, size=(32, 24)),
    "mp4": lambda: clips.video_clip(0.4, fps=10, size=(32, 24)),
}
FLIPS = 150


def corrupt_variants(name: str) -> list[tuple[str, bytes]]:
    data = SMALL[name]()
    return ([(f"prefix {n}", body) for n, body in prefixes(data, seed=27)]
            + [(f"flip {flips}", body) for flips, body in bit_flips(data, seed=27,
                                                                    count=FLIPS)])


def _outcome(data: bytes, isolated: bool) -> str:
    try:
        info, _frames = probe_and_frames(data, isolated)
    except EXPECTED as exc:
        return exc.__class__.__name__
    return info.kind


@pytest.mark.parametrize("name", sorted(SMALL))
def test_corrupt_inputs_end_in_a_clear_error(name):
    """Every prefix (all up to 128 bytes, a seeded sample beyond) and seeded bit flips,
    decoded in this process: a frame list or BadImage/UnsupportedImage/ImageTooLarge.
    Any other exception fails the test; a hang is cut short by faulthandler."""
    faulthandler.dump_traceback_later(240, exit=True)
    try:
        census = Counter(_outcome(body, False) for _, body in corrupt_variants(name))
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert set(census) <= {"BadImage", "UnsupportedImage", "ImageTooLarge", "animation",
                           "video", "still"}, census
    assert census["BadImage"] > 0


@pytest.mark.parametrize("name", sorted(SMALL))
def test_corrupt_inputs_in_the_helper_never_time_out_nor_kill_it(name):
    """The same classes through the isolated helper: the same answers, and not one helper
    killed (a kill is a timeout or a death), so no file hangs or crashes the decoder."""
    killed = POOL.killed
    variants = corrupt_variants(name)
    isolated = [_outcome(body, True) for _, body in variants]
    assert POOL.killed == killed
    assert isolated == [_outcome(body, False) for _, body in variants]


# -- audio: made into a track of its own in the helper ------------------------------------
def _audio_packets(data: bytes) -> list[tuple[bytes, float, float]]:
    """(payload, pts, duration) in seconds of every packet of the first audio stream."""
    import io

    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        return [(bytes(p), float(p.pts * p.time_base), float(p.duration * p.time_base))
                for p in container.demux(stream) if p.dts is not None]


def _span(packets: list[tuple[bytes, float, float]]) -> float:
    return max(t + d for _, t, d in packets) - min(t for _, t, _ in packets)


def extract(data: bytes, isolated: bool, **options) -> media.AudioTrack | None:
    info = media.probe(data, LIMITS, DECODE)
    if isolated:
        return helper_decoder(**options).audio(data, info)
    return media.audio(data, info, LIMITS)


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("container", ["mp4", "mov", "webm"])
def test_audio_track_round_trip(container, isolated):
    """AAC (MP4, MOV) comes back packet for packet, Opus (WebM) as AAC; the same span within
    50 ms either way."""
    data = clips.video_clip(seconds=1.5, fps=10, container=container)
    track = extract(data, isolated)
    assert track is not None and track.complete
    source, made = _audio_packets(data), _audio_packets(track.data)
    if container == "webm":
        assert (track.codec, track.transcoded) == ("opus", True)
    else:
        assert (track.codec, track.transcoded) == ("aac", False)
        assert made == source
    assert abs(_span(made) - _span(source)) <= 0.050


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_mp3_audio_is_copied_like_aac(isolated):
    """By the codec's name ("mp3"), not its decoder's ("mp3float"): copied, not
    re-encoded."""
    data = clips.video_clip(seconds=1.5, fps=10, container="mp4", audio_codec="libmp3lame")
    track = extract(data, isolated)
    assert track is not None and track.complete
    assert (track.codec, track.transcoded) == ("mp3", False)
    assert _audio_packets(track.data) == _audio_packets(data)


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_a_silent_video_has_no_track(isolated):
    assert extract(clips.video_clip(0.5, fps=10, audio=False), isolated) is None


def _clip_with_audio(video_seconds: float, audio_seconds: float, pad: int = 0) -> bytes:
    """A 10 fps MP4 with an AAC tone of ``audio_seconds``, each packet ``pad`` seeded random
    bytes longer than the encoder made it (a copy never decodes them: only the size counts)."""
    import io
    import random
    from fractions import Fraction

    import av
    import numpy as np

    rng = random.Random(27)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        video = out.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 96, 64, "yuv420p"
        video.options = {"preset": "ultrafast"}
        sound = out.add_stream("aac", rate=clips.AUDIO_RATE, layout="mono")
        for index, image in enumerate(clips.camera_move(round(video_seconds * 10))):
            frame = av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, 10)
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        for tone in [*clips._tone(audio_seconds, 1024), None]:
            for packet in sound.encode(tone):
                if pad:
                    fat = av.Packet(bytes(packet) + rng.randbytes(pad))
                    fat.pts, fat.dts, fat.duration = packet.pts, packet.dts, packet.duration
                    fat.time_base, fat.stream = packet.time_base, sound
                    packet = fat
                out.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_audio_past_the_video_is_cut_in_the_track(isolated):
    """A 0.5 s video with 20 s of audio: the track ends AUDIO_OVERRUN_S after the video."""
    track = extract(_clip_with_audio(0.5, 20.0), isolated)
    assert track is not None
    end = max(t + d for _, t, d in _audio_packets(track.data))
    assert 0.5 + media.AUDIO_OVERRUN_S - 0.05 <= end <= 0.5 + media.AUDIO_OVERRUN_S + 0.05


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_an_audio_track_over_its_byte_budget_is_refused(isolated):
    """60 KB packets, 47 a second (2.8 MB/s, ten times AUDIO_BYTES_PER_S): 413 once the
    track passes audio_budget's bytes, with the helper alive for the next request."""
    data = _clip_with_audio(1.0, 1.0, pad=60_000)
    killed = POOL.killed
    with pytest.raises(ImageTooLarge, match="audio holds more than"):
        extract(data, isolated)
    assert POOL.killed == killed
    assert extract(clips.video_clip(0.5, fps=10), isolated) is not None


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_decoder_reads_with_its_own_limits_and_isolation(isolation):
    """Probe, frames and audio follow the decoder's media limits (the app's settings, not
    the defaults: the audio is cut one second after max_seconds), and ``thread`` reads all
    three in this process, starting no helper."""
    data = clips.video_clip(3.0, fps=10)
    info = media.probe(data, LIMITS, DECODE)
    decoder = Decoder(limits=DECODE, media=MediaLimits(max_seconds=1.0), isolation=isolation,
                      timeout=20)
    POOL.close()  # no idle helper: a read in one starts it
    started = POOL.started
    with pytest.raises(ImageTooLarge, match="at most 1 s"):
        decoder.probe(data)
    with pytest.raises(ImageTooLarge, match="more than 1 s"):
        list(decoder.frames(data, info, size=32))
    track = decoder.audio(data, info)
    assert track is not None and _span(_audio_packets(track.data)) <= 2.0 + 0.1
    assert (POOL.started == started) is (isolation == "thread")


def test_an_audio_helper_past_its_time_is_killed():
    data = clips.video_clip(1.0, fps=10, container="webm")
    killed = POOL.killed
    with pytest.raises(ImageTooLarge, match="audio took more than"):
        extract(data, True, timeout=0.0)
    assert POOL.killed == killed + 1
    assert extract(data, True) is not None  # a new helper answers the next


def test_an_audio_helper_out_of_memory_fails_clearly():
    """A 5 s video whose 1.4 MB track is within its byte budget, under an address-space
    limit of 256 KiB: the helper answers (or dies, and is replaced) with a 4xx error."""
    data = _clip_with_audio(5.0, 5.0, pad=6_000)
    with pytest.raises((ImageTooLarge, BadImage)):
        extract(data, True, memory=256 << 10)
    assert extract(data, True) is not None


def _audio_flips(container: str, count: int) -> list[tuple[str, bytes]]:
    """Seeded flips of 1-4 bits inside the audio packets' bytes only (their offsets in the
    file, as the demuxer reports them)."""
    import io
    import random

    import av

    data = clips.video_clip(0.6, fps=10, size=(32, 24), container=container)
    with av.open(io.BytesIO(data)) as source:
        spans = [(p.pos, p.size) for p in source.demux(source.streams.audio[0])
                 if p.dts is not None and p.pos is not None and p.pos >= 0 and p.size]
    rng = random.Random(27)
    variants = []
    for _ in range(count):
        body = bytearray(data)
        names = []
        for _ in range(rng.choice((1, 2, 4))):
            pos, size = rng.choice(spans)
            at, bit = pos + rng.randrange(size), 1 << rng.randrange(8)
            body[at] ^= bit
            names.append(f"@{at}^{bit}")
        variants.append((" ".join(names), bytes(body)))
    return variants


def _garbled_audio_clip(container: str, every: int, seed: int) -> bytes:
    """A 0.6 s clip (32x24, 10 fps) whose every ``every``-th audio packet is replaced by as
    many seeded random bytes, muxed as a valid packet: a sound container, hostile codec data."""
    import io
    import random

    import av

    data = clips.video_clip(0.6, fps=10, size=(32, 24), container=container)
    rng = random.Random(seed)
    buffer = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, \
            av.open(buffer, "w", format="mp4" if container == "mp4" else "webm") as out:
        streams = {s.index: out.add_stream_from_template(s) for s in source.streams
                   if s.type in ("video", "audio")}
        audio_index = source.streams.audio[0].index
        count = 0
        for packet in source.demux():
            index = packet.stream.index
            if packet.dts is None or index not in streams:
                continue
            if index == audio_index:
                if count % every == 0:
                    garbled = av.Packet(rng.randbytes(packet.size))
                    garbled.pts, garbled.dts = packet.pts, packet.dts
                    garbled.duration, garbled.time_base = packet.duration, packet.time_base
                    packet = garbled
                count += 1
            packet.stream = streams[index]
            out.mux(packet)
    return buffer.getvalue()


AUDIO_CLASSES = {
    "aac-bit-flips": lambda: [body for _, body in _audio_flips("mp4", 40)],
    "opus-bit-flips": lambda: [body for _, body in _audio_flips("webm", 40)],
    "aac-garbled": lambda: [_garbled_audio_clip("mp4", every, seed)
                            for every in (1, 2, 5) for seed in range(3)],
    "opus-garbled": lambda: [_garbled_audio_clip("webm", every, seed)
                             for every in (1, 2, 5) for seed in range(3)],
}


def _audio_outcome(data: bytes, isolated: bool) -> str:
    try:
        track = extract(data, isolated)
    except EXPECTED as exc:
        return exc.__class__.__name__
    if track is None:
        return "none"
    return "complete" if track.complete else "cut"


@pytest.mark.parametrize("name", sorted(AUDIO_CLASSES))
def test_hostile_audio_packets_give_a_track_or_a_clear_error(name):
    """Bit flips in the audio packets' bytes, and packets replaced by random bytes: copied
    AAC is copied as it is (never decoded: nothing to refuse); Opus, decoded for the
    transcode, loses the packets its decoder refuses. The helper gives the same answers as
    this process and is never killed."""
    variants = AUDIO_CLASSES[name]()
    killed = POOL.killed
    isolated = [_audio_outcome(body, True) for body in variants]
    assert POOL.killed == killed
    assert isolated == [_audio_outcome(body, False) for body in variants]
    assert set(isolated) <= {"complete", "cut", "none", "BadImage", "ImageTooLarge"}, isolated
    if name.startswith("aac"):
        assert set(isolated) == {"complete"}


def test_a_helper_whose_caller_is_gone_exits_quietly():
    """A worker killed mid-job leaves its helper writing frames into a pipe nobody reads:
    it exits at once, status 0, without a traceback in the worker's log."""
    import json
    import subprocess
    import sys
    from dataclasses import asdict

    data = clips.gif_from_photos(40, size=(96, 64))
    info = media.probe(data, LIMITS, DECODE)
    header = json.dumps({"op": "frames", "media": asdict(LIMITS), "decode": asdict(DECODE),
                         "info": asdict(info), "size": 64, "square": False,
                         "memory": 256 << 20}).encode()
    helper = subprocess.Popen([sys.executable, "-m", "flask_animegan.inputs.helper"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert helper.stdin is not None and helper.stdout is not None
    helper.stdin.write(struct.pack(">II", len(header), len(data)) + header + data)
    helper.stdin.flush()
    assert helper.stdout.read(8)  # the first frame's answer has begun
    helper.stdout.close()
    try:
        assert helper.wait(timeout=20) == 0
    finally:
        helper.kill()
        helper.stdin.close()
    stderr = helper.stderr.read()
    helper.stderr.close()
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr, stderr.decode()


@pytest.mark.parametrize("what", ["probe", "frames"])
def test_a_media_helper_that_got_no_cpu_blames_the_load_not_the_file(what):
    """The one rule for every request (isolation.STARVED_SHARE): a helper stopped outright
    (SIGSTOP, as a busy machine starves it) past its timeout is a 503 to try again with
    Retry-After, not a 413 for the file; the next request gets a fresh helper."""
    import os
    import signal

    data = clips.video_clip(1, audio=False)
    info = media.probe(data, LIMITS, DECODE)
    POOL.close()
    POOL.give_back(POOL.take())
    helper = POOL._idle[0]
    os.kill(helper.process.pid, signal.SIGSTOP)
    killed = POOL.killed
    try:
        with pytest.raises(Overloaded, match="too busy") as refused:
            if what == "probe":
                helper_decoder(timeout=1.0).probe(data)
            else:
                list(helper_decoder(timeout=1.0).frames(data, info, size=64))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.process.pid, signal.SIGCONT)
    assert refused.value.status == 503 and refused.value.retry_after >= 1
    assert POOL.killed == killed + 1
    assert len(probe_and_frames(data, True)[1]) == 10
