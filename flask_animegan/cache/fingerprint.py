"""What the cache keeps of an upload, and the one rule that decides "the same photo".

A :class:`Fingerprint` of an upload is its perceptual hash (the candidate key), the size
it is fitted to for the network, its own size in pixels and how it was compressed (a
JPEG's tables), and the two grids of :mod:`flask_animegan.inputs.samples`, rounded to
whole levels (uint8, 11,264 bytes): statistics of the upright picture reduced by a power
of two and resampled (triangle filter) to 512 x 512 samples, which the decode helper
computes and sends back:

* ``luma``: on a 64 x 64 grid, each cell's mean luma (Y) and its standard deviation;
* ``cells``: on a 32 x 32 grid, each cell's mean Cb and Cr and its detail, the mean
  absolute difference between neighbouring luma samples.

The samples are taken from the decoded upload, not from the input fitted to the output
(a JPEG at the smallest DCT scale that keeps 512 samples a side): a hit needs no fit,
and the fingerprint of a photo is the same at every output size. That is all an entry
keeps of its input: never the upload, never its pixels.

The rule (:meth:`Fingerprint.same_photo`, stated in docs/http-api.md): two inputs are the
same photo when their phashes are within ``max_distance`` bits, their aspect ratios within
``ASPECT_TOLERANCE``, and in every cell the mean luma differs by at most ``mean_levels``
levels plus ``mean_per_deviation`` of the cell's standard deviation, each colour mean by
at most ``colour_levels`` levels, and the detail by at most ``DETAIL_SHARE`` of the larger
one or ``DETAIL_LEVELS`` levels, whichever allows more. The means see what is covered,
pasted or recoloured; the detail sees what is blurred or pixelated, which keeps local
means (a mosaic's flat blocks have no differences inside them). Resizing and re-encoding
move the means of textured cells more than those of flat ones, hence the allowance per
unit of deviation. Two uploads of the same pixel size (a copy saved again, and every edit
of a photo, which keeps its size) differ only by re-encoding and what was edited, so
their means get the tight :data:`SAME_SIZE` allowance; a resized copy has another pixel
size, its samples are resampled from another grid, and it gets :data:`OTHER_SIZE`. Two
JPEGs of the same pixel size saved with the same quantization tables (an edit, or a copy
saved again at the photo's own quality; never a resized copy) differ by next to nothing
outside what changed, since re-saving a JPEG with its own tables hardly moves it: they
get :data:`SAME_JPEG_SHARE` of every allowance (:func:`allowance_share`), so a faint edit
no longer hides in the noise that a copy at another quality makes. bench/cache_rule.py chose every number here (its figures are in
docs/http-api.md); change them only with it. The cost: an edit that moves no cell by more
than that, i.e. one no stronger than what JPEG or a 5 % resize does to the picture (a blur
of a flat sky, a faint mosaic over 1 % of a picture), may share a result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .samples import CELLS_SHAPE, COARSE_SIDE, FINE_SIDE, LUMA_SHAPE, Samples


@dataclass(frozen=True)
class Allowance:
    """How far the means of two inputs' cells may differ."""

    mean_levels: float  # luma, plus...
    mean_per_deviation: float  # ...this share of the cell's standard deviation
    colour_levels: float  # Cb and Cr


#: Two uploads of the same pixel size: re-encoding (or an edit) alone between them.
SAME_SIZE = Allowance(mean_levels=2.0, mean_per_deviation=0.1, colour_levels=4.0)
#: Uploads of different pixel sizes: a resized copy.
OTHER_SIZE = Allowance(mean_levels=3.75, mean_per_deviation=0.1875, colour_levels=5.0)
DETAIL_SHARE = 0.5
DETAIL_LEVELS = 5.0
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo
#: The share of every allowance for two JPEGs of the same pixel size and quantization tables.
SAME_JPEG_SHARE = 0.55
GRID_BYTES = FINE_SIDE * FINE_SIDE * 2 + COARSE_SIDE * COARSE_SIDE * 3


@dataclass(frozen=True)
class Fingerprint:
    """An upload as the cache compares it: phash, fitted size, own size, JPEG tables and
    the two cell grids."""

    phash: int
    size: tuple[int, int]  # the width and height it is fitted to for the network
    luma: np.ndarray  # LUMA_SHAPE uint8
    cells: np.ndarray  # CELLS_SHAPE uint8
    source: tuple[int, int] = (0, 0)  # the upload's own width and height; (0, 0): unknown
    jpeg_tables: int = 0  # a digest of the upload's JPEG tables (DecodedUpload); 0: none

    @classmethod
    def of(cls, samples: Samples, hash_size: int, *, size: tuple[int, int],
           source: tuple[int, int] | None = None, jpeg_tables: int = 0) -> Fingerprint:
        """The fingerprint of an upload from its statistics (a SampledUpload's), fitted to
        ``size`` for the network, of ``source`` pixels (None: ``size``) and
        ``jpeg_tables``: the grids as they are, and the phash of the thumbnail."""
        import imagehash  # imported on first use: `flask` commands need none of it

        bits = np.packbits(imagehash.phash(samples.thumb, hash_size=hash_size).hash.flatten())
        source = source or size
        return cls(int.from_bytes(bits.tobytes(), "big"), (int(size[0]), int(size[1])),
                   samples.luma, samples.cells, (int(source[0]), int(source[1])),
                   int(jpeg_tables))

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
        allowed = SAME_SIZE if self.source == other.source else OTHER_SIZE
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
