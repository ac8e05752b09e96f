"""The fidelity guard: a backend and precision serves a style only if its pictures stay
within ``MIN_PSNR_DB`` of torch fp32's on the package's own photos (INT8: its own bar, at
two sizes, as its errors grow with size); verdicts are kept per weights file."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from .base import Runner, to_pixels

MIN_PSNR_DB = 40.0
MIN_PSNR_DB_INT8 = 35.0
PHOTOS_DIR = Path(__file__).resolve().parents[2] / "static"
PHOTOS = ("sample-photo.jpg", "fidelity-coffee.jpg", "fidelity-chelsea.jpg")
SIDE = 128
INT8_SIDES = (SIDE, 256)

_lock = threading.Lock()
_references: dict[tuple[str, int], tuple[np.ndarray, ...]] = {}
_verdicts: dict[tuple[str, str, str], float] = {}


def min_db(precision: str) -> float:
    """The bar a candidate in ``precision`` has to reach."""
    return MIN_PSNR_DB_INT8 if precision == "int8" else MIN_PSNR_DB


@functools.cache
def photos(side: int = SIDE) -> tuple[np.ndarray, ...]:
    """The guard's photos as uint8 RGB arrays (H, W, 3), fitted to ``side`` px (Lanczos)."""
    arrays = []
    for name in PHOTOS:
        with Image.open(PHOTOS_DIR / name) as opened:
            image = opened.convert("RGB")
        scale = side / max(image.size)
        if scale > 1:  # the photos are 192 px: larger sides are enlarged
            image = image.resize((round(image.width * scale), round(image.height * scale)),
                                 Image.Resampling.LANCZOS)
        else:
            image.thumbnail((side, side), Image.Resampling.LANCZOS)
        arrays.append(np.array(image, dtype=np.uint8))
    return tuple(arrays)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 pictures, in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def pictures(runner: Runner, side: int = SIDE) -> tuple[np.ndarray, ...]:
    """What ``runner`` makes of the guard's photos (a blank picture where it fails)."""
    made = []
    for photo in photos(side):
        pixels = to_pixels(runner(photo))
        made.append(pixels if pixels is not None else np.zeros_like(photo))
    return tuple(made)


def fidelity_db(digest: str, reference: Runner, candidate: Runner) -> float:
    """The lowest PSNR of ``candidate`` against torch fp32 over the photos; remembered."""
    verdict = (digest, candidate.backend, candidate.precision)
    with _lock:
        if verdict in _verdicts:
            return _verdicts[verdict]
    value = float("inf")
    for side in INT8_SIDES if candidate.precision == "int8" else (SIDE,):
        with _lock:
            expected = _references.get((digest, side))
            if expected is None:
                expected = _references[digest, side] = pictures(reference, side)
        value = min(value, *(psnr(a, b) for a, b in zip(expected, pictures(candidate, side))))
    with _lock:
        _verdicts[verdict] = value
    return value
