"""What the cache keeps of an input, and the one rule that decides "the same photo".

A :class:`Fingerprint` of the fitted input (the picture the network converts) is its
perceptual hash (the candidate key), its size in pixels, the upload's own size and how
it was compressed (a JPEG's tables), and two grids of statistics laid over the picture,
whatever its size, rounded to whole levels (uint8, 11,264 bytes). Both are taken from
one copy of the picture resampled with Lanczos to ``SAMPLE_SIDE`` x ``SAMPLE_SIDE``
samples (:func:`samples`): inputs of slightly different sizes (a resized copy of a photo
smaller than the output, which is never upscaled) are then cut at the same places and
smoothed alike, where a box filter would repeat rows and columns at other places in each:

* ``luma``: on a ``FINE_SIDE`` x ``FINE_SIDE`` grid, each cell's mean luma (Y) and its
  standard deviation;
* ``cells``: on a ``COARSE_SIDE`` x ``COARSE_SIDE`` grid, each cell's mean Cb and Cr and
  its detail, the mean absolute difference between neighbouring luma samples.

That is all an entry keeps of its input: never the upload, never its pixels.

The rule (:meth:`Fingerprint.same_photo`, stated in docs/http-api.md): two inputs are the
same photo when their phashes are within ``max_distance`` bits, their aspect ratios within
``ASPECT_TOLERANCE``, and in every cell the mean luma differs by at most ``mean_levels``
levels plus ``mean_per_deviation`` of the cell's standard deviation, each colour mean by
at most ``colour_levels`` levels, and the detail by at most ``DETAIL_SHARE`` of the larger
one or ``DETAIL_LEVELS`` levels, whichever allows more. The means see what is covered,
pasted or recoloured; the detail sees what is blurred or pixelated, which keeps local
means (a mosaic's flat blocks have no differences inside them). Resizing and re-encoding
move the means of textured cells more than those of flat ones, hence the allowance per
unit of deviation. Two inputs fitted to the same size (every photo at least as large as
the output, and every edit of a photo, which keeps its size) differ only by re-encoding,
so their means get the tight :data:`SAME_SIZE` allowance; a resized copy of a photo
smaller than the output is fitted to another size (images are never upscaled), and gets
:data:`OTHER_SIZE`. Two JPEGs of the same pixel size saved with the same quantization
tables (an edit, or a copy saved again at the photo's own quality; never a resized copy)
differ by next to nothing outside what changed, since re-saving a JPEG with its own
tables hardly moves it: they get :data:`SAME_JPEG_SHARE` of every allowance
(:func:`allowance_share`), so a faint edit no longer hides in the noise that a copy at
another quality makes. bench/cache_rule.py chose every number here (its figures are in
docs/http-api.md); change them only with it. The cost: an edit that moves no cell by more
than that, i.e. one no stronger than what JPEG or a 5 % resize does to the picture (a blur
of a flat sky, a faint mosaic over 1 % of a picture), may share a result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..process import in_halves

FINE_SIDE = 64  # cells per side of the luma grid: a 1 % box (10 % x 10 %) covers >= 5x5
COARSE_SIDE = 32  # cells per side of the colour and detail grid (JPEG halves colour anyway)
CELL_SAMPLES = 8  # each cell's statistics are taken over 8x8 samples
SAMPLE_SIDE = FINE_SIDE * CELL_SAMPLES  # the Lanczos-resampled copy both grids are taken from

@dataclass(frozen=True)
class Allowance:
    """How far the means of two inputs' cells may differ."""

    mean_levels: float  # luma, plus...
    mean_per_deviation: float  # ...this share of the cell's standard deviation
    colour_levels: float  # Cb and Cr


#: Two inputs fitted to the same size: re-encoding alone between them.
SAME_SIZE = Allowance(mean_levels=2.0, mean_per_deviation=0.1, colour_levels=4.0)
#: Fitted to different sizes: a resized copy of a photo smaller than the output.
OTHER_SIZE = Allowance(mean_levels=3.0, mean_per_deviation=0.15, colour_levels=4.0)
DETAIL_SHARE = 0.5
DETAIL_LEVELS = 5.0
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo
#: The share of every allowance for two JPEGs of the same pixel size and quantization tables.
SAME_JPEG_SHARE = 0.55
LUMA_SHAPE = (FINE_SIDE, FINE_SIDE, 2)  # [row, column, (mean, standard deviation)]
CELLS_SHAPE = (COARSE_SIDE, COARSE_SIDE, 3)  # [row, column, (Cb mean, Cr mean, detail)]
GRID_BYTES = FINE_SIDE * FINE_SIDE * 2 + COARSE_SIDE * COARSE_SIDE * 3


@dataclass(frozen=True)
class Fingerprint:
    """A fitted input as the cache compares it: phash, fitted size and the two cell grids."""

    phash: int
    size: tuple[int, int]  # the fitted input's width and height
    luma: np.ndarray  # LUMA_SHAPE uint8
    cells: np.ndarray  # CELLS_SHAPE uint8
    source: tuple[int, int] = (0, 0)  # the upload's own width and height; (0, 0): unknown
    jpeg_tables: int = 0  # a digest of the upload's JPEG tables (DecodedUpload); 0: none

    @classmethod
    def of(cls, image: Image.Image, hash_size: int, *, source: tuple[int, int] | None = None,
           jpeg_tables: int = 0) -> Fingerprint:
        """The fingerprint of ``image``, the fitted input of an upload of ``source`` pixels
        and ``jpeg_tables`` (a DecodedUpload's ``source_size`` and ``jpeg_tables``)."""
        import imagehash  # imported on first use: `flask` commands need none of it

        sampled = samples(image)

        def phash_and_cells() -> tuple[np.ndarray, np.ndarray]:
            bits = np.packbits(imagehash.phash(sampled, hash_size=hash_size).hash.flatten())
            return bits, cell_grid(sampled)

        # the luma grid beside the rest, where a second CPU is free
        (bits, cells), luma = in_halves(phash_and_cells, lambda: luma_grid(sampled))
        return cls(int.from_bytes(bits.tobytes(), "big"), image.size, luma, cells,
                   (int(source[0]), int(source[1])) if source else (0, 0), int(jpeg_tables))

    @property
    def aspect(self) -> float:
        """Width / height."""
        return self.size[0] / self.size[1]

    def distance(self, other: Fingerprint) -> int:
        """Hamming distance between the phashes."""
        return (self.phash ^ other.phash).bit_count()

    def excess(self, other: Fingerprint) -> float:
        """How far the two grids are apart, as the largest ratio, over every cell and
        statistic, of the difference to what the rule allows there (at most 1: the same
        photo, as far as the grids can tell); symmetric."""
        allowed = SAME_SIZE if self.size == other.size else OTHER_SIZE
        share = allowance_share(self, other)
        a, b = self.luma.astype(np.float32), other.luma.astype(np.float32)
        deviation = np.maximum(a[..., 1], b[..., 1])
        mean = np.abs(a[..., 0] - b[..., 0]) / (allowed.mean_levels
                                                + allowed.mean_per_deviation * deviation)
        c, d = self.cells.astype(np.float32), other.cells.astype(np.float32)
        colour = np.abs(c[..., :2] - d[..., :2]) / allowed.colour_levels
        detail = np.abs(c[..., 2] - d[..., 2]) / np.maximum(
            DETAIL_LEVELS, DETAIL_SHARE * np.maximum(c[..., 2], d[..., 2]))
        return float(max(mean.max(), colour.max(), detail.max())) / share

    def same_photo(self, other: Fingerprint, max_distance: int) -> bool:
        """The cache's whole rule (see the module docstring); symmetric."""
        return (self.distance(other) <= max_distance
                and abs(other.aspect / self.aspect - 1) <= ASPECT_TOLERANCE
                and self.excess(other) <= 1.0)

    def to_bytes(self) -> bytes:
        """The two grids, as an index member stores them (GRID_BYTES)."""
        return (np.ascontiguousarray(self.luma, np.uint8).tobytes()
                + np.ascontiguousarray(self.cells, np.uint8).tobytes())

    @staticmethod
    def grids_from(blob: bytes, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The two grids :meth:`to_bytes` wrote at ``offset`` of ``blob``."""
        fine = FINE_SIDE * FINE_SIDE * 2
        luma = np.frombuffer(blob, np.uint8, fine, offset).reshape(LUMA_SHAPE)
        cells = np.frombuffer(blob, np.uint8, GRID_BYTES - fine, offset + fine)
        return luma, cells.reshape(CELLS_SHAPE)


def allowance_share(a: Fingerprint, b: Fingerprint) -> float:
    """The share of every allowance that two inputs get: SAME_JPEG_SHARE for two JPEGs of
    the same pixel size and quantization tables, 1 for anything else (another format,
    other tables, a resized copy, an upload of unknown size)."""
    if a.source == b.source != (0, 0) and a.jpeg_tables == b.jpeg_tables != 0:
        return SAME_JPEG_SHARE
    return 1.0


def samples(image: Image.Image) -> Image.Image:
    """``image`` as the grids see it: RGB, resampled with Lanczos to SAMPLE_SIDE x
    SAMPLE_SIDE, whatever its size and shape. (Not in two bands on two threads, as the
    fit is: at 512 px one band took 2.35 ms of the whole's 2.74 ms.)"""
    return image.convert("RGB").resize((SAMPLE_SIDE, SAMPLE_SIDE), Image.Resampling.LANCZOS)


def _ycbcr(sampled: Image.Image, side: int) -> np.ndarray:
    """The :func:`samples` averaged over whole blocks to ``side`` x ``side``, as float
    YCbCr."""
    if sampled.size != (SAMPLE_SIDE, SAMPLE_SIDE):
        raise ValueError(f"the grids take the {SAMPLE_SIDE}-sample copy of samples(), "
                         f"not a {sampled.width}x{sampled.height} image")
    reduced = sampled if side == SAMPLE_SIDE else sampled.reduce(SAMPLE_SIDE // side)
    return np.asarray(reduced.convert("YCbCr"), np.float32)


def _cell_means(values: np.ndarray, cells: int) -> np.ndarray:
    starts = np.arange(0, cells * CELL_SAMPLES, CELL_SAMPLES)
    sums = np.add.reduceat(np.add.reduceat(values, starts, axis=0), starts, axis=1)
    return np.asarray(sums / CELL_SAMPLES**2)


def _levels(stats: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.clip(np.rint(np.stack(stats, axis=-1)), 0, 255)
                                .astype(np.uint8))


def luma_grid(sampled: Image.Image) -> np.ndarray:
    """Each fine cell's mean luma and its standard deviation, in whole levels, from the
    :func:`samples` of a picture."""
    y = _ycbcr(sampled, SAMPLE_SIDE)[..., 0]
    mean = _cell_means(y, FINE_SIDE)
    deviation = np.sqrt(np.maximum(_cell_means(y * y, FINE_SIDE) - mean**2, 0))
    return _levels([mean, deviation])


def cell_grid(sampled: Image.Image) -> np.ndarray:
    """Each coarse cell's mean Cb and Cr and its detail, in whole levels, from the
    :func:`samples` of a picture."""
    ycc = _ycbcr(sampled, COARSE_SIDE * CELL_SAMPLES)
    means = _cell_means(ycc[..., 1:], COARSE_SIDE)
    y = ycc[..., 0]
    steps = np.zeros_like(y)
    steps[:, :-1] += np.abs(np.diff(y, axis=1))
    steps[:-1, :] += np.abs(np.diff(y, axis=0))
    return _levels([means[..., 0], means[..., 1], _cell_means(steps, COARSE_SIDE)])
