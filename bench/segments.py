"""What converting a video in segments costs, against one encode of the whole clip.

``python -m bench.segments [--seconds 20] [--size 256]``: a pan over a photo, converted once
by the shipped style; its frames then encoded (1) whole, with B-frames (libx264's default,
what the writer did before segments), (2) whole without B-frames, (3) in two-second segments
without B-frames, joined (what jobs write now). Prints the sizes, each one's PSNR against the
converted frames, the time to join, and the time to join the first half as the part
converted so far (docs/benchmark.md, "Video in segments").
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any

import av
import numpy as np
from PIL import Image

from bench.jobs import Motion, motion_frames
from flask_animegan.outputs import animations
from flask_animegan.outputs.segments import Segment

FPS = 25
SEGMENT = 2 * FPS


def converted_frames(seconds: float, size: int) -> list[Image.Image]:
    """The pan's frames through the shipped style (torch, fp32) at ``size``."""
    from flask import Flask

    from flask_animegan import AnimeGAN

    app = Flask("bench_segments")
    app.config.update(SECRET_KEY="bench-segments", ANIMEGAN_SAMPLE_SIZE=0,
                      ANIMEGAN_RATE_LIMIT="", ANIMEGAN_BACKEND="torch",
                      ANIMEGAN_PRECISION="fp32")
    AnimeGAN(app)
    converter = app.extensions["animegan"].converter
    width = size
    height = round(size * 9 / 16 / 2) * 2
    return [converter.stylize(image, "toon_demo", "off")
            for image in motion_frames(Motion("pan", 1.0), round(seconds * FPS),
                                       (width, height))]


def encode(frames: list[Image.Image], params: str | None) -> bytes:
    """The frames as one MP4 with ``params`` for libx264 (None: its defaults)."""
    original = animations.X264_PARAMS
    animations.X264_PARAMS = params or ""
    try:
        writer = animations.Mp4Writer(fps=FPS, quality=90)
        for index, image in enumerate(frames):
            writer.add(image, 1000 // FPS, None, pts=index / FPS)
        return writer.finish()
    finally:
        animations.X264_PARAMS = original


def segmented(frames: list[Image.Image]) -> list[Segment]:
    segments = []
    for first in range(0, len(frames), SEGMENT):
        part = frames[first:first + SEGMENT]
        writer = animations.Mp4Writer(fps=FPS, quality=90)
        for index, image in enumerate(part):
            writer.add(image, 1000 // FPS, None, pts=index / FPS)
        segments.append(Segment(first // SEGMENT, first, len(part), 0, first / FPS,
                                (first + len(part)) / FPS, writer.finish()))
    return segments


def psnr(data: bytes, frames: list[Image.Image]) -> tuple[float, float]:
    """The lowest and the mean PSNR of ``data``'s frames against the converted frames."""
    with av.open(io.BytesIO(data)) as container:
        decoded = [frame.to_ndarray(format="rgb24").astype(np.float64)
                   for frame in container.decode(container.streams.video[0])]
    assert len(decoded) == len(frames), (len(decoded), len(frames))
    values = []
    for got, image in zip(decoded, frames):
        want = np.asarray(image, dtype=np.float64)[:got.shape[0], :got.shape[1]]
        error = np.mean((got - want) ** 2)
        values.append(10 * np.log10(255 ** 2 / error) if error else 99.0)
    return min(values), float(np.mean(values))


def measure(seconds: float, size: int) -> dict[str, Any]:
    frames = converted_frames(seconds, size)
    rows: dict[str, Any] = {}
    for name, params in (("whole, B-frames", None), ("whole, B-frames, no mbtree", "mbtree=0"),
                         ("whole, no B-frames", "bframes=0")):
        started = time.perf_counter()
        data = encode(frames, params)
        worst, mean = psnr(data, frames)
        rows[name] = {"bytes": len(data), "psnr_db": round(worst, 2), "mean_db": round(mean, 2),
                      "encode_s": round(time.perf_counter() - started, 2)}
    started = time.perf_counter()
    segments = segmented(frames)
    encoded = time.perf_counter() - started
    started = time.perf_counter()
    joined = animations.Mp4Join(None).join(segments)
    joining = time.perf_counter() - started
    started = time.perf_counter()
    animations.Mp4Join(None).join(segments[:len(segments) // 2], overrun=0.0)
    half = time.perf_counter() - started
    worst, mean = psnr(joined, frames)
    rows["2-s segments joined (jobs)"] = {
        "bytes": len(joined), "psnr_db": round(worst, 2), "mean_db": round(mean, 2),
        "encode_s": round(encoded, 2), "join_ms": round(joining * 1000, 1),
        "half_join_ms": round(half * 1000, 1)}
    return {"seconds": seconds, "size": size, "frames": len(frames), "rows": rows}


def render(result: dict[str, Any]) -> str:
    base = result["rows"]["whole, B-frames"]["bytes"]
    lines = [f"{result['seconds']:g} s pan at {FPS} fps, {result['size']} px wide, "
             f"converted by toon_demo, quality 90:", "",
             "| encoded | bytes | size vs whole with B-frames | PSNR, lowest / mean (dB) | "
             "encode (s) |", "|---|---|---|---|---|"]
    for name, row in result["rows"].items():
        lines.append(f"| {name} | {row['bytes']:,} | {row['bytes'] / base:.2f}x | "
                     f"{row['psnr_db']} / {row['mean_db']} | {row['encode_s']} |")
    joined = result["rows"]["2-s segments joined (jobs)"]
    lines += ["", f"Joining the {result['frames'] // SEGMENT} segments: "
                  f"{joined['join_ms']} ms; the first half as the part converted so far: "
                  f"{joined['half_join_ms']} ms."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args(argv)
    print(render(measure(args.seconds, args.size)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
