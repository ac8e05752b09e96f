"""Odd sizes: seconds per megapixel over aspect ratios, per backend, with and without
reflect-padding to a multiple of 8, 16 or 32 (``python -m bench.odd_sizes [--quick]``).

All variants are timed in turns; the padded output is compared with the unpadded one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import skimage.data
from PIL import Image

from flask_animegan.process import configure_process
from flask_animegan.runtime.backends import fidelity
from flask_animegan.runtime.backends.base import to_pixels
from flask_animegan.runtime.backends.torch import TorchRunner
from flask_animegan.runtime.precision import native_bf16
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
from flask_animegan.runtime.weights import load_generator

from . import ceilings

#: (height, width) at 512 px on the long side: common ratios, landscape and portrait
SHAPES = ((512, 512), (384, 512), (341, 512), (320, 512), (288, 512), (410, 512),
          (256, 512), (512, 341), (512, 384), (383, 511), (347, 509))
QUICK_SHAPES = ((512, 512), (341, 512), (320, 512), (512, 341))
ALIGNMENTS = (1, 4, 8, 16, 32)


def padded(run: Callable[[np.ndarray], np.ndarray], align: int
           ) -> Callable[[np.ndarray], np.ndarray]:
    """``run`` on pixels reflect-padded to a multiple of ``align``, then cropped back."""
    def call(pixels: np.ndarray) -> np.ndarray:
        height, width = pixels.shape[:2]
        more = ((0, -height % align), (0, -width % align), (0, 0))
        return run(np.pad(pixels, more, mode="reflect"))[:height, :width]
    return call


def runners(threads: int) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Every backend and precision ``auto`` may serve here."""
    weights = SHIPPED_STYLES_DIR / "toon_demo.pt"
    found: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    for precision in ("fp32", "bf16") if native_bf16() else ("fp32",):
        found[f"torch {precision}"] = TorchRunner(load_generator(weights), precision)
    try:
        from flask_animegan.runtime.backends.openvino import OpenVINOBackend
    except ImportError:
        return found
    backend = OpenVINOBackend(cache_dir=None, threads=threads)
    for precision in backend.precisions():
        found[f"openvino {precision}"] = backend.runner(load_generator(weights).eval(),
                                                        precision, weights)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.odd_sizes")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    threads = configure_process(ceilings.usable_cpus())
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rounds = args.rounds or (2 if args.quick else 3)
    print(f"# Odd sizes: s/Mpx, {threads} threads, CPU {ceilings.machine_info()['cpu_model']}, "
          f"median of {rounds} rounds in turns\n")
    # a photo (not noise): what padding does to the picture shows on real edges
    source = Image.fromarray(np.asarray(skimage.data.coffee())).convert("RGB")
    for backend, run in runners(threads).items():
        pictures = {shape: np.array(source.resize(shape[::-1], Image.Resampling.LANCZOS))
                    for shape in shapes}
        calls = {align: padded(run, align) for align in ALIGNMENTS}
        times: dict[tuple[tuple[int, int], int], list[float]] = {}
        fidelity_db: dict[tuple[tuple[int, int], int], float] = {}
        for shape, picture in pictures.items():
            plain = to_pixels(calls[1](picture))
            for align, call in calls.items():
                made = to_pixels(call(picture))  # the first call builds kernels
                assert made is not None and plain is not None and made.shape == plain.shape
                fidelity_db[shape, align] = fidelity.psnr(plain, made)
        for _ in range(rounds):
            for shape, picture in pictures.items():
                for align, call in calls.items():
                    started = time.perf_counter()
                    call(picture)
                    times.setdefault((shape, align), []).append(time.perf_counter() - started)
        print(f"## {backend}\n")
        print("| H x W | " + " | ".join(f"pad to {a}" if a > 1 else "as is" for a in ALIGNMENTS)
              + " | best | worst PSNR padded vs as is |")
        print("| --- |" + " --- |" * (len(ALIGNMENTS) + 2))
        for shape in shapes:
            mpx = shape[0] * shape[1] / 1e6
            per = {a: statistics.median(times[shape, a]) / mpx for a in ALIGNMENTS}
            best = min(per, key=lambda a: per[a])
            worst = min(fidelity_db[shape, a] for a in ALIGNMENTS if a > 1)
            print(f"| {shape[0]}x{shape[1]} | " + " | ".join(f"{per[a]:.2f}" for a in ALIGNMENTS)
                  + f" | {'as is' if best == 1 else best} | {worst:.1f} dB |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
