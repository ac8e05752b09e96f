"""The fidelity guard: a backend and precision serves a style only if its pictures stay
within ``MIN_PSNR_DB`` of torch fp32's on real photos.

The photos ship in the package (``static/``): scikit-image's astronaut (NASA, public
domain; also the style picker's sample), coffee and chelsea (both CC0), fitted to
``SIDE`` px: about 0.1 s per photo and backend on 2 cores. Verdicts are kept per
weights file for the life of the process.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from .base import Runner, to_pixels

MIN_PSNR_DB = 40.0
PHOTOS_DIR = Path(__file__).resolve().parents[2] / "static"
PHOTOS = ("sample-photo.jpg", "fidelity-coffee.jpg", "fidelity-chelsea.jpg")
SIDE = 128

_lock = threading.Lock()
_references: dict[str, tuple[np.ndarray, ...]] = {}
_verdicts: dict[tuple[str, str, str], float] = {}


@functools.cache
def photos() -> tuple[np.ndarray, ...]:
    """The guard's photos as uint8 RGB arrays (H, W, 3)."""
    arrays = []
    for name in PHOTOS:
        with Image.open(PHOTOS_DIR / name) as image:
            image = image.convert("RGB")
        image.thumbnail((SIDE, SIDE), Image.Resampling.LANCZOS)
        arrays.append(np.array(image, dtype=np.uint8))
    return tuple(arrays)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 pictures, in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(255.0 ** 2 / mse))


def pictures(runner: Runner) -> tuple[np.ndarray, ...]:
    """What ``runner`` makes of the guard's photos (a blank picture where it fails)."""
    made = []
    for photo in photos():
        pixels = to_pixels(runner(photo))
        made.append(pixels if pixels is not None else np.zeros_like(photo))
    return tuple(made)


def fidelity_db(digest: str, reference: Runner, candidate: Runner) -> float:
    """The lowest PSNR of ``candidate`` against ``reference`` (torch fp32 of the same
    weights, ``digest``) over the photos; remembered per weights and candidate."""
    verdict = (digest, candidate.backend, candidate.precision)
    with _lock:
        if verdict in _verdicts:
            return _verdicts[verdict]
        expected = _references.get(digest)
        if expected is None:
            expected = _references[digest] = pictures(reference)
    value = min(psnr(a, b) for a, b in zip(expected, pictures(candidate)))
    with _lock:
        _verdicts[verdict] = value
    return value
