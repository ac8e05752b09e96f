"""What the cache keeps of an input, and the one rule that decides "the same photo".

A :class:`Fingerprint` of the fitted input (the picture the network converts) is its
perceptual hash (the candidate key), its aspect ratio and a grid of statistics: the
picture is cut into ``GRID_SIDE`` x ``GRID_SIDE`` cells, whatever its size, and each
cell keeps the mean and standard deviation of its luma (Y) and the means of its two
colour differences (Cb, Cr), rounded to whole levels (uint8, 4,096 bytes). That is all
an entry keeps of its input: never the upload, never its pixels.

The rule (:meth:`Fingerprint.same_photo`, stated in docs/http-api.md): two inputs are
the same photo when their phashes are within ``max_distance`` bits, their aspect ratios
within ``ASPECT_TOLERANCE``, and every statistic of every cell within ``CELL_TOLERANCE``
levels. The means see what is covered, pasted or recoloured; the luma's standard
deviation (detail) sees what is blurred or pixelated, which keeps local means. JPEG
keeps colour at half resolution and quantises it harder, so colour keeps only its means.
bench/cache_rule.py chose ``GRID_SIDE`` and ``CELL_TOLERANCE`` (its figures are in
docs/http-api.md); change them only with it. The cost: an edit that moves no cell's
statistics by more than ``CELL_TOLERANCE`` levels, i.e. one no stronger than what JPEG
or a 5 % resize does to the picture (a blur of a flat sky, a mosaic finer than a cell),
may share a result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

GRID_SIDE = 32  # cells per side: a 10 % x 10 % box (1 % of the area) covers >= 2x2 cells
CELL_PIXELS = 8  # each cell's statistics are taken over 8x8 samples of a box-filtered copy
CELL_TOLERANCE = 9  # levels (of 255) any statistic of any cell may differ by
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo
STATISTICS = ("Y mean", "Y standard deviation", "Cb mean", "Cr mean")
GRID_SHAPE = (GRID_SIDE, GRID_SIDE, len(STATISTICS))
GRID_BYTES = GRID_SIDE * GRID_SIDE * len(STATISTICS)


@dataclass(frozen=True)
class Fingerprint:
    """A fitted input as the cache compares it: phash, aspect and the cell grid."""

    phash: int
    aspect: float  # width / height
    grid: np.ndarray  # GRID_SHAPE uint8: [row, column, statistic] (see STATISTICS)

    @classmethod
    def of(cls, image: Image.Image, hash_size: int) -> Fingerprint:
        """The fingerprint of ``image``, the fitted input."""
        import imagehash  # imported on first use: `flask` commands need none of it

        image = image.convert("RGB")
        bits = np.packbits(imagehash.phash(image, hash_size=hash_size).hash.flatten())
        return cls(int.from_bytes(bits.tobytes(), "big"), image.width / image.height,
                   cell_grid(image))

    def distance(self, other: Fingerprint) -> int:
        """Hamming distance between the phashes."""
        return (self.phash ^ other.phash).bit_count()

    def same_photo(self, other: Fingerprint, max_distance: int) -> bool:
        """The cache's whole rule (see the module docstring); symmetric."""
        return (self.distance(other) <= max_distance
                and abs(other.aspect / self.aspect - 1) <= ASPECT_TOLERANCE
                and grid_difference(self.grid, other.grid) <= CELL_TOLERANCE)


def cell_grid(image: Image.Image) -> np.ndarray:
    """Each cell's :data:`STATISTICS`, in whole levels.

    The picture is box-filtered to ``GRID_SIDE * CELL_PIXELS`` samples a side first, so
    that copies of slightly different sizes (a resized upload) are cut at the same places.
    """
    side = GRID_SIDE * CELL_PIXELS
    samples = image.convert("RGB").resize((side, side), Image.Resampling.BOX)
    ycc = np.asarray(samples.convert("YCbCr"), np.float32)
    starts = np.arange(0, side, CELL_PIXELS)

    def cell_means(values: np.ndarray) -> np.ndarray:
        sums = np.add.reduceat(np.add.reduceat(values, starts, axis=0), starts, axis=1)
        return np.asarray(sums / CELL_PIXELS**2)

    mean = cell_means(ycc)
    luma = ycc[..., 0]
    detail = np.sqrt(np.maximum(cell_means(luma * luma) - mean[..., 0] ** 2, 0))
    stats = np.stack((mean[..., 0], detail, mean[..., 1], mean[..., 2]), axis=-1)
    return np.ascontiguousarray(np.clip(np.rint(stats), 0, 255).astype(np.uint8))


def grid_difference(a: np.ndarray, b: np.ndarray) -> int:
    """The largest difference, in levels, between any statistic of any cell."""
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
