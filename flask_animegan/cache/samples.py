"""The statistics the cache compares, taken from the fitted picture in memory.

A bridge: the cache's own rewrite replaces this module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

FINE_SIDE = 64  # cells per side of the luma grid: a 1 % box (10 % x 10 %) covers >= 5x5
COARSE_SIDE = 32  # cells per side of the colour and detail grid (JPEG halves colour anyway)
CELL_SAMPLES = 8  # each cell's statistics are taken over 8x8 samples
SAMPLE_SIDE = FINE_SIDE * CELL_SAMPLES  # the resampled copy every statistic comes from
THUMB_SIDE = SAMPLE_SIDE // 2
LUMA_SHAPE = (FINE_SIDE, FINE_SIDE, 2)  # [row, column, (mean, standard deviation)]
CELLS_SHAPE = (COARSE_SIDE, COARSE_SIDE, 3)  # [row, column, (Cb mean, Cr mean, detail)]


@dataclass(frozen=True)
class Samples:
    """A picture's statistics, as the cache compares them (see the module docstring)."""

    luma: np.ndarray  # LUMA_SHAPE uint8
    cells: np.ndarray  # CELLS_SHAPE uint8
    thumb: Image.Image  # "L", THUMB_SIDE x THUMB_SIDE

    def __post_init__(self) -> None:
        if (self.luma.shape != LUMA_SHAPE or self.cells.shape != CELLS_SHAPE
                or self.luma.dtype != np.uint8 or self.cells.dtype != np.uint8
                or self.thumb.mode != "L" or self.thumb.size != (THUMB_SIDE, THUMB_SIDE)):
            raise ValueError("not the statistics of describe(): grids of "
                             f"{LUMA_SHAPE} and {CELLS_SHAPE} uint8 and a "
                             f"{THUMB_SIDE}-pixel L thumbnail")

    def to_bytes(self) -> bytes:
        """The grids and the thumbnail, as a helper sends them (:meth:`from_bytes`)."""
        return b"".join((self.luma.tobytes(), self.cells.tobytes(), self.thumb.tobytes()))

    @classmethod
    def from_bytes(cls, blob: bytes) -> Samples:
        """The statistics :meth:`to_bytes` wrote; ValueError if ``blob`` is not
        :data:`BYTES` long."""
        if len(blob) != BYTES:
            raise ValueError(f"statistics are {BYTES} bytes, not {len(blob)}")
        luma_bytes, cells_bytes = int(np.prod(LUMA_SHAPE)), int(np.prod(CELLS_SHAPE))
        luma = np.frombuffer(blob, np.uint8, luma_bytes).reshape(LUMA_SHAPE)
        cells = np.frombuffer(blob, np.uint8, cells_bytes, luma_bytes).reshape(CELLS_SHAPE)
        thumb = Image.frombytes("L", (THUMB_SIDE, THUMB_SIDE), blob[luma_bytes + cells_bytes:])
        return cls(luma, cells, thumb)


#: The bytes of :meth:`Samples.to_bytes`.
BYTES = int(np.prod(LUMA_SHAPE)) + int(np.prod(CELLS_SHAPE)) + THUMB_SIDE * THUMB_SIDE


def sample_reduction(source_size: tuple[int, int], side: int) -> int:
    """The power of two (1 to 8) a picture of ``source_size`` is reduced by before it is
    resampled to ``side`` x ``side`` samples: the most that keeps both sides at least
    ``side``. A JPEG is reduced so in its decoder (DCT scaling, which costs less than
    decoding it whole), any other picture with ``Image.reduce``, so that a photo sent as
    JPEG and as PNG is sampled alike."""
    most = min(source_size) // side
    return next(factor for factor in (8, 4, 2, 1) if factor <= max(most, 1))


def resampled(image: Image.Image,
              box: tuple[float, float, float, float] | None = None) -> Image.Image:
    """``image`` (its ``box``) as RGB, resampled with the triangle filter to SAMPLE_SIDE x
    SAMPLE_SIDE."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return rgb.resize((SAMPLE_SIDE, SAMPLE_SIDE), Image.Resampling.BILINEAR, box=box,
                      reducing_gap=3.0)


def describe(sampled: Image.Image) -> Samples:
    """The statistics of :func:`resampled` samples (ValueError for any other image)."""
    if sampled.size != (SAMPLE_SIDE, SAMPLE_SIDE) or sampled.mode != "RGB":
        raise ValueError(f"describe() takes the {SAMPLE_SIDE} x {SAMPLE_SIDE} RGB samples of "
                         f"resampled(), not a {sampled.width}x{sampled.height} "
                         f"{sampled.mode} image")
    ycc = sampled.convert("YCbCr")
    half = ycc.reduce(2)
    return Samples(luma_grid(np.asarray(ycc.getchannel(0))),
                   cell_grid(np.asarray(half, np.float32)), half.getchannel(0))


def of_picture(image: Image.Image) -> Samples:
    """The statistics of a whole picture in memory (any mode and size), as if it were
    uploaded losslessly: for tests and tools."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    factor = sample_reduction(rgb.size, SAMPLE_SIDE)
    return describe(resampled(rgb.reduce(factor) if factor > 1 else rgb))


def _cell_sums(values: np.ndarray, cells: int, dtype: type | None = None) -> np.ndarray:
    """The sums of ``values`` (a square of cells x CELL_SAMPLES, 2-D) over each cell of
    CELL_SAMPLES x CELL_SAMPLES."""
    side = cells * CELL_SAMPLES
    rows = np.ascontiguousarray(values).reshape(cells, CELL_SAMPLES, side).sum(axis=1,
                                                                               dtype=dtype)
    return np.asarray(rows.reshape(cells, cells, CELL_SAMPLES).sum(axis=2, dtype=dtype))


def _levels(stats: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.clip(np.rint(np.stack(stats, axis=-1)), 0, 255)
                                .astype(np.uint8))


def luma_grid(luma: np.ndarray) -> np.ndarray:
    """Each fine cell's mean luma and its standard deviation, in whole levels, from the
    samples' luma (SAMPLE_SIDE square, uint8). Sums are exact (integers): 255² fits 16
    bits and a cell's sum of squares 32."""
    count = CELL_SAMPLES**2
    mean = _cell_sums(luma, FINE_SIDE, np.uint32) / count
    wide = luma.astype(np.uint16)
    np.multiply(wide, wide, out=wide)
    deviation = np.sqrt(np.maximum(_cell_sums(wide, FINE_SIDE, np.uint32) / count - mean**2, 0))
    return _levels([mean, deviation])


def cell_grid(half: np.ndarray) -> np.ndarray:
    """Each coarse cell's mean Cb and Cr and its detail, in whole levels, from the samples
    in YCbCr averaged 2x2 (SAMPLE_SIDE / 2 square, float)."""
    count = CELL_SAMPLES**2
    y = np.ascontiguousarray(half[..., 0])
    steps = np.zeros_like(y)
    steps[:, :-1] += np.abs(np.diff(y, axis=1))
    steps[:-1, :] += np.abs(np.diff(y, axis=0))
    return _levels([_cell_sums(half[..., 1], COARSE_SIDE) / count,
                    _cell_sums(half[..., 2], COARSE_SIDE) / count,
                    _cell_sums(steps, COARSE_SIDE) / count])
