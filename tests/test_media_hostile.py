"""Hostile animations and videos at the default limits (MediaLimits(), DecodeLimits()),
through the helper process (Decoder.probe / Decoder.frames) as the
jobs use it: codec bombs (a few hundred kilobytes of solid-colour H.264 that decode to
8000x8000 frames, a stream that changes its size in-band after a small header), frame
counts the header understates or does not give, 100,000-frame GIFs, huge canvases, zero
durations and 1,000 fps. Each ends in a clear 4xx ConversionError within seconds, with
the helper's memory under its address-space limit; the time and the helper's peak
resident size of each are printed (``pytest -s``)."""

from __future__ import annotations

import io
import re
import struct
import threading
import time
import zlib
from fractions import Fraction
from typing import Self

import av
import media as clips
import pytest
from test_media import _webm_duration, _webp_canvas

from flask_animegan.errors import BadImage, ConversionError, ImageTooLarge
from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.inputs.isolation import POOL, SLACK_BYTES, Decoder
from flask_animegan.inputs.media import MediaLimits

#: The limits the hostile files are held to: 600 frames and 30 s, so that each needs few
#: frames to cross one (the defaults allow five minutes).
LIMITS, DECODE = MediaLimits(max_frames=600, max_seconds=30.0), DecodeLimits()
SIZE = 256
#: Seconds a hostile file may take: far above the ~1 s each takes, far below a hang.
BOUND_S = 20.0
MiB = 1 << 20


# -- the files ---------------------------------------------------------------------------
def _solid(width: int, height: int) -> av.VideoFrame:
    frame = av.VideoFrame(width, height, "yuv420p")
    for plane in frame.planes:
        plane.update(bytes([100]) * plane.buffer_size)
    return frame


def h264_solid(width: int, height: int, frames: int = 2, container: str = "mp4") -> bytes:
    """Solid-colour H.264 frames of ``width`` x ``height``: 64 megapixels in ~190 KB."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "40"}
        frame = _solid(width, height)
        for index in range(frames):
            frame.pts, frame.time_base = index, Fraction(1, 25)
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def mp4_claims(data: bytes, width: int, height: int) -> bytes:
    """The MP4 with its sample entry (avc1) and track header saying ``width`` x ``height``;
    the SPS and the frames keep their own size."""
    body = bytearray(data)
    at = body.index(b"avc1") + 4 + 24
    body[at:at + 4] = struct.pack(">HH", width, height)
    tkhd = body.index(b"tkhd")
    end = tkhd - 4 + struct.unpack_from(">I", body, tkhd - 4)[0]
    body[end - 8:end] = struct.pack(">II", width << 16, height << 16)
    return bytes(body)


def resolution_change(container: str, big: tuple[int, int] = (8000, 8000)) -> bytes:
    """Five 64x64 frames (the header's size), then a key frame with a new in-band SPS of
    ``big``: the size changes after the probe."""
    def packets(size: tuple[int, int], count: int, start: int) -> list[av.Packet]:
        encoder = av.CodecContext.create("libx264", "w")
        encoder.width, encoder.height, encoder.pix_fmt = *size, "yuv420p"
        encoder.time_base = Fraction(1, 25)
        encoder.options = {"preset": "ultrafast", "crf": "40"}
        frame = _solid(*size)
        made: list[av.Packet] = []
        for index in range(count):
            frame.pts = start + index
            made += encoder.encode(frame)
        return made + encoder.encode(None)

    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = 64, 64, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 25)
        for packet in packets((64, 64), 5, 0) + packets(big, 1, 5):
            packet.stream, packet.time_base = stream, Fraction(1, 25)
            out.mux(packet)
    return buffer.getvalue()


def tiny_video(frames: int, fps: float = 25, container: str = "matroska",
               live: bool = False) -> bytes:
    """``frames`` 16x16 frames (each a new grey); ``live``: Matroska's live mode, which
    writes no duration (so no frame count either)."""
    import numpy as np

    rate = Fraction(fps).limit_denominator(1001)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container, options={"live": "1"} if live else {}) as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        stream.options = {"preset": "ultrafast"}
        stream.codec_context.time_base = 1 / rate
        for index in range(frames):
            pixels = np.full((16, 16, 3), index % 256, np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = index, 1 / rate
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def gif_of_1x1(frames: int, delay: int = 0) -> bytes:
    """A GIF of ``frames`` 1x1 frames of ``delay`` hundredths of a second (23 bytes each)."""
    frame = (b"\x21\xf9\x04\x00" + struct.pack("<H", delay) + b"\x00\x00"
             + b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00")
    return b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0, 0, 0) + frame * frames + b"\x3b"


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def apng_canvas(width: int, height: int, frames: int = 3) -> bytes:
    """An APNG whose IHDR says ``width`` x ``height`` while its frames hold a few bytes."""
    data = clips.apng(n=frames, size=(32, 24))
    at = data.index(b"IHDR") - 4
    ihdr = bytearray(data[at + 8:at + 8 + 13])
    ihdr[0:8] = struct.pack(">II", width, height)
    return data[:at] + _png_chunk(b"IHDR", bytes(ihdr)) + data[at + 25:]


def apng_frame(width: int, height: int) -> bytes:
    """An APNG of a 32x24 image whose second frame's fcTL says ``width`` x ``height``."""
    data = clips.apng(n=3, size=(32, 24))
    first = data.index(b"fcTL")
    at = data.index(b"fcTL", first + 4) - 4
    body = bytearray(data[at + 8:at + 8 + 26])
    body[4:12] = struct.pack(">II", width, height)
    return data[:at] + _png_chunk(b"fcTL", bytes(body)) + data[at + 38:]


# name: (file, the errors accepted, what the message says)
BOMBS = {
    "h264-8000x8000": (lambda: h264_solid(8000, 8000), ImageTooLarge, "pixels"),
    "h264-8000x8000-header-says-64x64": (lambda: mp4_claims(h264_solid(8000, 8000), 64, 64),
                                         ImageTooLarge, "pixels"),
    "h264-size-change-to-8000x8000-mp4": (lambda: resolution_change("mp4"), BadImage,
                                          "corrupt"),
    "h264-size-change-to-8000x8000-mkv": (lambda: resolution_change("matroska"),
                                          ImageTooLarge, "pixels"),
    "mkv-no-duration-700-frames": (lambda: tiny_video(700, live=True), ImageTooLarge,
                                   "more than 600 frames"),
    "mkv-header-says-1s-700-frames": (
        lambda: _webm_duration(tiny_video(700), 1.0), ImageTooLarge,
        "more than 600 frames"),
    "mp4-1000-fps": (lambda: tiny_video(200, fps=1000, container="mp4"), ImageTooLarge,
                     "frames a second"),
    "mkv-no-duration-1000-fps": (lambda: tiny_video(200, fps=1000, live=True), ImageTooLarge,
                                 "frames a second"),
    "gif-100000-frames": (lambda: gif_of_1x1(100_000), ImageTooLarge, "100,000 frames"),
    "gif-100000-frames-of-10ms": (lambda: gif_of_1x1(100_000, delay=1), ImageTooLarge,
                                  "frames"),
    "gif-zero-durations-400-frames": (lambda: gif_of_1x1(400), ImageTooLarge, "lasts"),
    "webp-canvas-16384x16384": (
        lambda: _webp_canvas(clips.webp_animation(n=3, size=(32, 24)), 16384, 16384),
        ImageTooLarge, "pixels"),
    "apng-canvas-30000x30000": (lambda: apng_canvas(30000, 30000), ImageTooLarge, "pixels"),
    "apng-frame-16000x16000": (lambda: apng_frame(16000, 16000), ImageTooLarge, "pixels"),
}


# -- the helper's peak -------------------------------------------------------------------
def _status(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakWatch:
    """The largest VmHWM (peak resident size) seen of the frames helpers started or
    reused while it runs: polled, so a helper killed right after its peak still counts."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def _pids() -> list[int]:
        import os

        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    command = cmdline.read()
            except (OSError, ValueError, IndexError):
                continue
            if parent == os.getpid() and b"flask_animegan.inputs.helper" in command:
                pids.append(int(entry))
        return pids

    def _poll(self) -> None:
        while not self._stop.is_set():
            for pid in self._pids():
                self.peak = max(self.peak, _status(pid, "VmHWM") or 0)
            time.sleep(0.01)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


REPORT: list[tuple[str, int, float, int, str]] = []


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    print("\n| file | bytes | seconds | helper peak RSS | answer |\n|---|---|---|---|---|")
    for name, size, seconds, peak, answer in REPORT:
        print(f"| {name} | {size:,} | {seconds:.2f} | {peak / MiB:.0f} MiB | {answer} |")


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_hostile_file_ends_in_a_clear_4xx_within_seconds(name):
    make, expected, message = BOMBS[name]
    data = make()
    memory = DECODE.max_bytes + 3 * SIZE * SIZE + SLACK_BYTES
    decoder = Decoder(limits=DECODE, media=LIMITS, timeout=BOUND_S)
    POOL.close()  # a fresh helper: its peak is this file's
    started = time.monotonic()
    seen = 0
    with PeakWatch() as watch, pytest.raises(ConversionError) as caught:
        info = decoder.probe(data)
        for _ in decoder.frames(data, info, size=SIZE, total_timeout=BOUND_S):
            seen += 1
    elapsed = time.monotonic() - started
    error = caught.value
    REPORT.append((name, len(data), elapsed, watch.peak,
                   (f"{error.__class__.__name__} ({error.status}) after {seen} frames: "
                    f"{str(error)[:70]}")))
    assert isinstance(error, expected), error
    assert 400 <= error.status < 500
    assert re.search(message, str(error)), error
    assert elapsed < BOUND_S
    # the helper's peak: what it held before the request (the interpreter, Pillow,
    # NumPy, PyAV: ~60 MiB) plus at most its address-space allowance
    assert 0 < watch.peak <= memory + 160 * MiB, f"{watch.peak / MiB:.0f} MiB"
