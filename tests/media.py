"""Generated test media: animations and short videos made from photos that ship in
scikit-image's wheel (never downloaded).

Every clip is a camera move over a photo: a pan from left to right with a slow zoom in,
so consecutive frames differ (the encoders would merge identical ones), optionally after
a static shot of identical frames (``static`` frames or ``static_seconds``) for the
frame-skipping measurement. Small by default (96x64, 10 frames), so the suite stays fast.

* :func:`gif_from_photos`, :func:`webp_animation`, :func:`apng`: Pillow's writers, with
  chosen per-frame durations, loop and (GIF, APNG) disposal;
* :func:`video_clip`: PyAV encodes MP4/MOV (H.264 + AAC) or WebM (VP8 + Opus), with a
  generated sine tone as its audio track.

Pillow's GIF, WebP and APNG writers merge identical consecutive frames (adding up their
durations), so a static shot survives only in videos.
"""

from __future__ import annotations

import functools
import io
import json
import math
import subprocess
import sys
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import skimage.data
from PIL import Image


#: A tone that is easy to find again in the decoded audio.
TONE_HZ = 440.0
AUDIO_RATE = 48_000  # Opus takes 48 kHz only; AAC takes it too


def photo(name: str = "chelsea") -> Image.Image:
    """A photograph from scikit-image's wheel as RGB (conftest's, without importing torch)."""
    array = getattr(skimage.data, name)()
    if isinstance(array, tuple):
        array = array[0]
    return Image.fromarray(np.asarray(array)).convert("RGB")


def camera_move(count: int, size: tuple[int, int] = (96, 64), name: str = "chelsea",
                static: int = 0) -> Iterator[Image.Image]:
    """``count`` RGB frames of ``size``: ``static`` identical frames, then a pan from the
    left of the photo to its right while zooming in from the whole height to 70 % of it."""
    source = photo(name)
    width, height = size
    moving = max(1, count - static - 1)
    for index in range(count):
        t = max(0, index - static) / moving
        crop_height = source.height * (1.0 - 0.3 * t)
        crop_width = min(source.width, crop_height * width / height)
        crop_height = crop_width * height / width
        left = (source.width - crop_width) * t
        top = (source.height - crop_height) / 2
        box = (left, top, left + crop_width, top + crop_height)
        yield source.resize(size, Image.Resampling.BILINEAR, box=box)


def _per_frame(value: int | float | Sequence[int | float], count: int) -> list[int | float]:
    if isinstance(value, (int, float)):
        return [value] * count
    assert len(value) == count, "one duration per frame"
    return list(value)


def gif_from_photos(n: int = 10, size: tuple[int, int] = (96, 64),
                    durations: int | Sequence[int] = 80, loop: int | None = 0,
                    disposal: int | Sequence[int] = 2, name: str = "chelsea",
                    transparency: bool = False) -> bytes:
    """An animated GIF of ``n`` frames (durations in ms: GIF stores tens of ms; ``loop``
    None: no NETSCAPE block, the GIF plays once). ``transparency``: the frames have a
    transparent border, so the disposal shows."""
    frames = list(camera_move(n, size, name))
    if transparency:
        frames = [_with_transparent_border(frame) for frame in frames]
    buffer = io.BytesIO()
    params: dict[str, object] = {"save_all": n > 1, "append_images": frames[1:],
                                 "duration": _per_frame(durations, n),
                                 "disposal": _per_frame(disposal, n), "optimize": False}
    if n == 1:  # Pillow takes lists for animations only
        params.update(duration=params["duration"][0], disposal=params["disposal"][0])
    if loop is not None:
        params["loop"] = loop
    frames[0].save(buffer, "GIF", **params)
    return buffer.getvalue()


def _with_transparent_border(frame: Image.Image) -> Image.Image:
    rgba = frame.convert("RGBA")
    alpha = Image.new("L", frame.size, 0)
    alpha.paste(255, (4, 4, frame.width - 4, frame.height - 4))
    rgba.putalpha(alpha)
    return rgba


def webp_animation(n: int = 10, size: tuple[int, int] = (96, 64),
                   durations: int | Sequence[int] = 80, loop: int = 0,
                   name: str = "chelsea", lossless: bool = False, quality: int = 80) -> bytes:
    """An animated WebP of ``n`` frames (durations in ms, ``loop`` 0 = forever)."""
    frames = list(camera_move(n, size, name))
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:],
                   duration=_per_frame(durations, n), loop=loop, lossless=lossless,
                   quality=quality, method=0)
    return buffer.getvalue()


def apng(n: int = 10, size: tuple[int, int] = (96, 64),
         durations: int | float | Sequence[int | float] = 80, loop: int = 0,
         disposal: int | Sequence[int] = 0, blend: int | Sequence[int] = 0,
         name: str = "chelsea") -> bytes:
    """An APNG of ``n`` frames (durations in ms, ``loop`` 0 = forever; disposal and blend
    as Pillow's ``PngImagePlugin.Disposal`` / ``Blend`` values)."""
    frames = list(camera_move(n, size, name))
    buffer = io.BytesIO()
    frames[0].save(buffer, "PNG", save_all=True, append_images=frames[1:],
                   duration=_per_frame(durations, n), loop=loop,
                   disposal=_per_frame(disposal, n), blend=_per_frame(blend, n),
                   compress_level=1)
    return buffer.getvalue()


#: container -> (PyAV's muxer, video codec, audio codec)
CONTAINERS: dict[str, tuple[str, str, str | None]] = {
    "mp4": ("mp4", "libx264", "aac"),
    "mov": ("mov", "libx264", "aac"),
    "webm": ("webm", "libvpx", "libopus"),
    "mkv": ("matroska", "libx264", "aac"),
    # containers that are not read (415): silent clips only
    "avi": ("avi", "mpeg4", None),
    "mpeg": ("mpeg", "mpeg2video", None),
    "mpegts": ("mpegts", "mpeg2video", None),
    "flv": ("flv", "flv", None),
    "asf": ("asf", "mpeg4", None),
}


def video_clip(seconds: float = 1.0, fps: float = 10, size: tuple[int, int] = (96, 64),
               container: str = "mp4", audio: bool = True, static_seconds: float = 0.0,
               name: str = "chelsea", codec: str | None = None, crf: int = 23,
               pix_fmt: str | None = None, audio_codec: str | None = None) -> bytes:
    """A clip of ``seconds`` at ``fps`` (``static_seconds`` of it a static shot first),
    with a mono sine tone of the same length when ``audio``. ``codec``: another video
    codec than the container's usual one (FFmpeg's encoder name), ``pix_fmt`` its pixel
    format, ``audio_codec`` another audio encoder; ``crf``: x264's quality
    (lower is better: at 23, a static shot's frames differ by more than the cache's rule
    for "the same photo" allows, as the encoder refines the picture frame by frame)."""
    muxer, video_codec, audio_codec_default = CONTAINERS[container]
    video_codec = codec or video_codec
    audio_codec = audio_codec or audio_codec_default
    assert audio_codec or not audio, f"no audio codec for {container}: pass audio=False"
    count = max(1, round(seconds * fps))
    rate = Fraction(fps).limit_denominator(1001)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as out:
        video = out.add_stream(video_codec, rate=rate)
        video.width, video.height = size
        video.pix_fmt = pix_fmt or ("rgb24" if video_codec == "png" else "yuv420p")
        video.codec_context.time_base = 1 / rate
        if video_codec == "libx264":
            video.options = {"preset": "ultrafast", "crf": str(crf)}
        elif video_codec.startswith("libvpx"):
            video.options = {"deadline": "realtime", "cpu-used": "8"}
        video.thread_count = 1
        sound = out.add_stream(audio_codec, rate=AUDIO_RATE, layout="mono") if audio else None
        for index, image in enumerate(camera_move(count, size, name,
                                                  static=round(static_seconds * fps))):
            frame = av.VideoFrame.from_image(image)
            frame.pts = index
            frame.time_base = video.codec_context.time_base
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
        if sound is not None:
            for frame in _tone(count / fps, sound.codec_context.frame_size or 1024):
                out.mux(sound.encode(frame))
            out.mux(sound.encode(None))
    return buffer.getvalue()


def _tone(seconds: float, chunk: int) -> Iterator[av.AudioFrame]:
    """A 440 Hz sine of ``seconds`` in frames of ``chunk`` samples (float planar, mono)."""
    total = math.ceil(seconds * AUDIO_RATE)
    for start in range(0, total, chunk):
        t = (np.arange(start, start + chunk) / AUDIO_RATE).astype(np.float32)
        samples = (0.3 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
        frame = av.AudioFrame.from_ndarray(samples[np.newaxis, :], format="fltp",
                                           layout="mono")
        frame.sample_rate = AUDIO_RATE
        frame.pts = start
        frame.time_base = Fraction(1, AUDIO_RATE)
        yield frame


#: Encoders whose threads run on their own (thread pools, lookahead): their clips are made
#: in a fresh interpreter, killed past a timeout. After they came into the tests, a test
#: worker (which holds torch's and FFmpeg's threads) twice spun at full CPU for over 15
#: minutes; these encoders are the suspects, the cause was never proven.
THREADED_ENCODERS = frozenset({"libsvtav1", "libx265"})


@functools.cache
def isolated_clip(**options: object) -> bytes:
    """:func:`video_clip` with ``options`` (JSON values), made in a child interpreter within
    60 s, tried three times."""
    code = ("import json, sys; from media import video_clip; "
            "options = json.loads(sys.stdin.read()); "
            "options['size'] = tuple(options.get('size', (96, 64))); "
            "sys.stdout.buffer.write(video_clip(**options))")
    for attempt in range(3):
        try:
            done = subprocess.run([sys.executable, "-c", code], input=json.dumps(options).encode(),
                                  capture_output=True, timeout=60, check=True,
                                  cwd=Path(__file__).parent)
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
            continue
        return done.stdout
    raise AssertionError("unreachable")


def decoded_video(data: bytes) -> dict[str, object]:
    """What a clip holds, decoded: frame count, frame times (s), size, fps and audio."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        times = [float(frame.time) for frame in container.decode(stream)]
        has_audio = bool(container.streams.audio)
        fps = float(stream.average_rate) if stream.average_rate else None
        width, height = stream.codec_context.width, stream.codec_context.height
    return {"frames": len(times), "times": times, "size": (width, height), "fps": fps,
            "audio": has_audio}
