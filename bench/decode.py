"""What decoding in a helper process costs per upload, against the thread, and what hostile
files cost before they are answered. ``python -m bench.decode [--runs 15] [--size 512]``
"""

from __future__ import annotations

import argparse
import io
import struct
import time

import numpy as np
import skimage.data
from PIL import Image

from flask_animegan.errors import ConversionError
from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.inputs.isolation import Decoder

from .timing import median


def _encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def photos() -> dict[str, bytes]:
    """A 1080 x 1350 portrait (the articles' selfie) in each accepted format."""
    portrait = Image.fromarray(skimage.data.astronaut()).resize((1080, 1350))
    return {
        "JPEG q90": _encode(portrait, "JPEG", quality=90),
        "JPEG progressive": _encode(portrait, "JPEG", quality=90, progressive=True),
        "PNG": _encode(portrait, "PNG"),
        "WebP": _encode(portrait, "WEBP", quality=90),
        "GIF": _encode(portrait.convert("P"), "GIF"),
        "BMP": _encode(portrait, "BMP"),
        "TIFF": _encode(portrait, "TIFF"),
    }


def hostile() -> dict[str, bytes]:
    buffer = io.BytesIO()
    Image.new("L", (8000, 5000), 128).save(buffer, "JPEG", progressive=True)
    data = buffer.getvalue()
    last, eoi = data.rfind(b"\xff\xda"), data.rfind(b"\xff\xd9")
    gif = (b"GIF89a" + struct.pack("<HH", 6000, 6000) + b"\x80\x00\x00\x00\x00\x00\xff\xff\xff"
           + b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00;")
    return {
        "scan bomb (8000x5000, +1000 scans)": data[:eoi] + data[last:eoi] * 1000 + data[eoi:],
        "tall PNG (1 x 40,000,000)": _encode(Image.new("L", (1, 40_000_000)), "PNG"),
        "GIF screen 6000x6000": gif,
        "noise PNG 5000x4000": _encode(Image.fromarray(
            np.random.default_rng(0).integers(0, 255, (4000, 5000, 3), np.uint8)), "PNG",
            compress_level=1),
    }


def _time(decoder: Decoder, data: bytes, size: int) -> tuple[float, str]:
    started = time.perf_counter()
    try:
        outcome = "x".join(map(str, decoder.decode(data, size=size).image.size))
    except ConversionError as exc:
        outcome = f"{exc.status}"
    return (time.perf_counter() - started) * 1000, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()
    decoders = {iso: Decoder(limits=DecodeLimits(), isolation=iso, timeout=5.0, slots=1,
                             max_queue=0, queue_timeout=60) for iso in ("thread", "process")}
    decoders["process"].start()
    for decoder in decoders.values():  # warm up (helper started, code paths loaded)
        _time(decoder, photos()["PNG"], args.size)

    print(f"decode to {args.size} px, median of {args.runs} (ms)")
    print(f"{'input':<22}{'bytes':>10}{'thread':>9}{'process':>9}{'+ms':>7}{'ratio':>7}")
    for name, data in photos().items():
        times: dict[str, list[float]] = {"thread": [], "process": []}
        for _ in range(args.runs):  # interleaved, so drift hits both alike
            for iso, decoder in decoders.items():
                times[iso].append(_time(decoder, data, args.size)[0])
        thread, process = median(times["thread"]), median(times["process"])
        print(f"{name:<22}{len(data):>10,}{thread:>9.1f}{process:>9.1f}"
              f"{process - thread:>7.1f}{process / thread:>7.2f}")

    print("\nhostile files: one run each (ms, status)")
    for name, data in hostile().items():
        cells = []
        for iso, decoder in decoders.items():
            ms, outcome = _time(decoder, data, args.size)
            cells.append(f"{iso} {ms:8.1f} ms -> {outcome}")
        print(f"{name:<36} {len(data):>10,} B   " + "   ".join(cells))


if __name__ == "__main__":
    main()
