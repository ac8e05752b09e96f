"""The backend interface: :class:`Runner`, :class:`Backend`, :class:`Choice`, and the
helpers every backend shares (output to pixels, weights digests, the cache folder)."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn


class Runner(Protocol):
    """One style's network on one backend, in one precision."""

    backend: str
    precision: str

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        """uint8 RGB (H, W, 3) -> float32 output in about [-1, 1], unclamped (NaN shows)."""
        ...


class Backend(Protocol):
    name: str

    def precisions(self) -> tuple[str, ...]:
        """The precisions this CPU computes natively with this backend (fp32 always)."""
        ...

    def runner(self, network: nn.Module, precision: str, weights: Path) -> Runner:
        """A runner for ``network`` (float32, loaded from ``weights``) in ``precision``."""
        ...


@dataclass(frozen=True)
class Choice:
    """A backend and a precision, e.g. ``openvino fp32``."""

    backend: str
    precision: str

    def __str__(self) -> str:
        return f"{self.backend} {self.precision}"


#: What every other choice is checked against, and what a style falls back to.
REFERENCE = Choice("torch", "fp32")


def to_pixels(output: np.ndarray) -> np.ndarray | None:
    """A runner's output as uint8 RGB, as torch's clamp/scale/round; None if not finite."""
    if not math.isfinite(float(output.sum(dtype=np.float64))):
        return None
    pixels = np.clip(output, -1.0, 1.0, out=np.empty(output.shape, np.float32))
    pixels += 1.0
    pixels *= 127.5
    np.rint(pixels, out=pixels)
    return pixels.astype(np.uint8)


_digests: dict[tuple[str, int, int], str] = {}


def weights_digest(path: Path) -> str:
    """SHA-256 of a weights file (remembered per path, size and mtime)."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    digest = _digests.get(key)
    if digest is None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        _digests[key] = digest
    return digest


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/flask-animegan``, else ``~/.cache/flask-animegan``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flask-animegan"
