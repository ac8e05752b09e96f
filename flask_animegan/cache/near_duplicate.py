"""The near-duplicate result cache and the result pages' store, on a shared Storage.

Both live in a :mod:`flask_animegan.cache.storage` backend: each in its own in-process
``MemoryStorage`` (bounded by ANIMEGAN_CACHE_MAX_BYTES and ANIMEGAN_RESULT_MAX_BYTES),
or in Redis, shared by every instance and bounded by the server's ``maxmemory`` with
``maxmemory-policy allkeys-lru``. No client can make Redis grow without bound: each
cache namespace (client, style, size, format) has one index capped at ``index_cap``
members, so at most ``index_cap`` live entries, and every key has a TTL.

Cache layout (keys under the storage's prefix, e.g. ``animegan:cache:``):

- ``index:<namespace digest>``: a list, newest first, of at most ``index_cap``
  members; a member is one entry's full fingerprint (phash, colour thumbnail, aspect,
  luma and colour grids, cell hashes), its id and its creation time: 29,766 bytes at
  hash_size 16.
- ``entry:<namespace digest>:<id>``: a 16-byte header (its width, height and the
  result's length), the result's bytes, then the input it was converted from (for a
  JPEG or PNG upload the service resized, of at most 8 MiB and 12.6 megapixels, first a
  flag byte, the file's length and the file without its metadata; then a byte saying
  whether it was an exact JPEG decode, then its grid, or strict; then its pixels as
  lossless WebP), for :meth:`CachedResult.same_source`.

Redis round trips: a hit costs 2 (read the index, run every check here, read the
chosen entry); a miss costs 2 (read the index, then store the new entry and its index
member in one MULTI/EXEC when the result is put). A miss whose best candidate's entry
was evicted meanwhile (Redis under ``maxmemory`` pressure) costs 3; each candidate that
passes every check on the index but not :meth:`CachedResult.same_source` (an edited
JPEG re-save, a lossy WebP of other pixels) costs one more read. A lookup reads at
most ``index_cap`` members: 465 KiB at the default 16.

Bytes per entry, measured with ``MEMORY USAGE`` on Redis 7.0 (tests/test_storage.py):
its result and kept input + about 150 bytes (key, header) + 32,808 bytes for its
member in the index; the value is rounded up to jemalloc's size class (up to +25 %,
about +10 % on average). The kept input is 54-380 KiB (median 193) for the 22 photos of
bench/cache_privacy.py at 512 px, about a quarter of that at 256 px, plus the uploaded
file (at most 8 MiB) when it is kept. A result page: its
two images + about 130 bytes, rounded the same way.

The namespace holds the client's address (ANIMEGAN_CACHE_SCOPE "client"), so keys
carry only a keyed BLAKE2b digest of it. Stored bytes use a small explicit binary
format, never pickle: data in a shared Redis must not be able to run code here, and
a member or value that does not parse is skipped like a miss.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import secrets
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from ..errors import ImageTooLarge
from ..inputs.decoding import ACCEPTED_FORMATS, without_metadata
from .jpeg_grid import (
    LOSSY_KEY,
    JpegGrid,
    grid_of,
    keepable_upload,
    same_source,
    same_upload,
)
from .storage import MemoryStorage, Storage
from .storage.memory import ITEM_OVERHEAD


def _ndimage() -> Any:
    """scipy.ndimage, imported on first use: it takes 0.2 s, which every `flask` command
    would pay at startup."""
    from scipy import ndimage

    return ndimage

THUMB_SIDE = 16
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo

# The local check compares fixed grids, whatever the input's size, so that resized
# copies line up cell for cell: luma at 128x128 (2-4 output pixels a cell at 256-512)
# and colour at 64x64 (JPEG keeps colour at half resolution anyway). Windows of 6 and
# 3 cells (4.7 % of a side) fit whole inside a 10 % x 10 % edit. bench/cache_privacy.py
# measured these choices; change them only with it.
LUMA_SIDE = 128
LUMA_WINDOW = 6
CHROMA_SIDE = 64
CHROMA_WINDOW = 3
LUMA_FLOOR = 0.75  # levels a window of a flat region may differ by (re-encoding noise)
CHROMA_FLOOR = 6.0  # the same for Cb + Cr, which JPEG quantises much more coarsely
NOISE_QUANTILE = 0.75  # which window sets a pair's "re-encoding noise per unit of detail"

# The lossless-copy check: a hash of every cell of a 32x32 grid of the fitted RGB pixels.
# Re-encoding or resizing changes every cell that is not a single flat colour, so two
# inputs whose non-flat cells are mostly bit-identical are the same file with something
# changed in the remaining cells: a local edit saved losslessly, however faint.
CELL_SIDE = 32
LOSSLESS_SHARE = 0.5  # of non-flat cells identical: the copy is the same pixels, edited
LOSSLESS_MIN_CELLS = 16  # fewer non-flat cells than this (a flat picture): no verdict


@dataclass(frozen=True)
class Fingerprint:
    """What decides whether two inputs are the same photo."""

    phash: int
    thumbnail: np.ndarray  # THUMB_SIDE x THUMB_SIDE x 3 float32, 0-255
    aspect: float
    luma: np.ndarray  # LUMA_SIDE x LUMA_SIDE uint8 (Y of YCbCr)
    chroma: np.ndarray  # CHROMA_SIDE x CHROMA_SIDE x 2 uint8 (Cb, Cr)
    cells: np.ndarray  # CELL_SIDE x CELL_SIDE uint16: a hash of each cell's pixels, 0 if flat
    # the input itself, for the exact JPEG re-save check (never stored in an index member)
    source: Image.Image | None = field(default=None, compare=False, repr=False)
    jpeg: JpegGrid | None = field(default=None, compare=False)  # set if an exact JPEG decode
    # shares a result only with identical pixels: a lossy WebP, or an upload the service
    # resized whose file is not kept (over the limits of jpeg_grid.keepable_upload)
    strict: bool = field(default=False, compare=False)
    # the JPEG or PNG file of an upload the service resized (at most 8 MiB and 12.6
    # megapixels), without its metadata, for the exact check at its own resolution
    # (jpeg_grid.same_upload)
    upload: bytes = field(default=b"", compare=False, repr=False)

    @classmethod
    def of(cls, image: Image.Image, hash_size: int, upload: bytes = b"") -> Fingerprint:
        """``image``: the fitted input; ``upload``: the file it was decoded from, if at hand."""
        import imagehash  # imported on first use, like scipy: `flask` commands need neither

        digest = imagehash.phash(image, hash_size=hash_size)
        bits = np.packbits(digest.hash.flatten())
        # box-average to 4x the side in uint8, then to the side in float: rounding
        # to whole levels would otherwise swamp the small shifts we must detect
        fine = np.asarray(image.resize((THUMB_SIDE * 4,) * 2, Image.Resampling.BOX), np.float32)
        thumb = fine.reshape(THUMB_SIDE, 4, THUMB_SIDE, 4, 3).mean(axis=(1, 3))
        grid = np.asarray(image.convert("YCbCr").resize((LUMA_SIDE,) * 2,
                                                         Image.Resampling.LANCZOS))
        step = LUMA_SIDE // CHROMA_SIDE
        chroma = grid[..., 1:].reshape(CHROMA_SIDE, step, CHROMA_SIDE, step, 2).mean(axis=(1, 3))
        jpeg = grid_of(image)
        kept, resized = (b"", False) if jpeg is not None else _kept_file(upload, image.size)
        return cls(int.from_bytes(bits.tobytes(), "big"), thumb, image.width / image.height,
                   np.ascontiguousarray(grid[..., 0]), chroma.round().astype(np.uint8),
                   cell_hashes(image), image, jpeg,
                   bool(image.info.get(LOSSY_KEY)) or (resized and not kept), kept)

    @property
    def nbytes(self) -> int:
        return self.thumbnail.nbytes + self.luma.nbytes + self.chroma.nbytes + self.cells.nbytes

    def distance(self, other: Fingerprint) -> int:
        return (self.phash ^ other.phash).bit_count()

    def same_colors(self, other: Fingerprint, tolerance: float) -> bool:
        """Whether the colour thumbnails match within ``tolerance`` (0-255 levels).

        Re-encoding or resizing a photo adds small, high-frequency differences; editing
        it (brightness, hue, recolouring) shifts colours systematically or changes whole
        regions. So the difference map is first smoothed over 3x3 cells (which removes
        resampling noise but keeps regional changes), then: its mean absolute value must
        be at most ``tolerance``, each channel's mean signed shift at most a third of it,
        and no cell may differ by more than five times it.
        """
        diff = _ndimage().uniform_filter(self.thumbnail - other.thumbnail, size=(3, 3, 1), mode="nearest")
        return bool(np.abs(diff).mean() <= tolerance
                    and np.abs(diff.reshape(-1, 3).mean(axis=0)).max() <= tolerance / 3
                    and np.abs(diff).max() <= tolerance * 5)

    def local_difference(self, other: Fingerprint) -> float:
        """How much the most changed small window differs, in units of this pair's noise.

        The 16x16 thumbnail cannot see a blurred, pixelated, covered or pasted patch of
        1 % of the image: the photo around it still matches. So luma and colour are
        compared window by window, and one window is enough to tell the inputs apart.
        Re-encoding and resizing change every window a little, in proportion to its
        detail (edges move by a fraction of a pixel, JPEG rounds fine texture); how much
        per unit of detail is measured on the pair itself, so a window counts only by
        how far it exceeds what this pair's own noise explains there. A typical window
        scores about 1; a blurred, pixelated, covered or replaced one several times more.
        Symmetric, so a planted doctored copy is told apart as well as a doctored query.
        """
        luma = self._window_excess(self.luma, other.luma, LUMA_WINDOW, LUMA_FLOOR)
        chroma = self._window_excess(self.chroma, other.chroma, CHROMA_WINDOW, CHROMA_FLOOR)
        return max(luma, chroma)

    @staticmethod
    def _window_excess(a: np.ndarray, b: np.ndarray, window: int, floor: float) -> float:
        """Largest ratio, over windows, of the difference to ``floor`` + noise gain x detail."""
        a = a.reshape(*a.shape[:2], -1).astype(np.float32)
        b = b.reshape(*b.shape[:2], -1).astype(np.float32)
        b += np.median((a - b).reshape(-1, a.shape[2]), axis=0)  # a global offset is not local
        diff = _ndimage().uniform_filter(np.abs(a - b).sum(axis=2), window, mode="nearest")
        # detail that both share: a blurred patch has none, so it is not excused by its original's
        shared = np.minimum(Fingerprint._gradient(a), Fingerprint._gradient(b))
        detail = _ndimage().uniform_filter(shared, window, mode="nearest")
        gain = np.quantile(diff / (detail + floor), NOISE_QUANTILE)
        return float((diff / (gain * detail + floor)).max())

    @staticmethod
    def _gradient(channels: np.ndarray) -> np.ndarray:
        """Sum over channels of the Sobel gradient magnitude, in levels per cell."""
        total = np.zeros(channels.shape[:2], np.float32)
        for c in range(channels.shape[2]):
            plane = channels[..., c]
            total += np.hypot(_ndimage().sobel(plane, 0, mode="nearest"),
                              _ndimage().sobel(plane, 1, mode="nearest")) / 8
        return total

    def edited_losslessly(self, other: Fingerprint) -> bool:
        """Whether the two are the same pixels except in some cells: an edit saved losslessly.

        JPEG re-encoding and resizing change every cell that is not one flat colour, so
        a pair with at least half its non-flat cells bit-identical comes from one file;
        if any cell differs, someone changed it, however little (a blur of a flat sky
        changes it by under a level, which no noise model can tell from re-encoding).
        """
        textured = (self.cells != 0) | (other.cells != 0)
        same = (self.cells == other.cells) & (self.cells != 0)
        count, identical = int(textured.sum()), int(same.sum())
        return (count >= LOSSLESS_MIN_CELLS and identical < count
                and identical >= LOSSLESS_SHARE * count)

    def same_locally(self, other: Fingerprint, tolerance: float) -> bool:
        """Whether no window differs by more than ``tolerance`` times this pair's noise, and
        the pair is not a losslessly saved local edit."""
        return (not self.edited_losslessly(other)
                and self.local_difference(other) <= tolerance)


def _kept_file(upload: bytes, size: tuple[int, int]) -> tuple[bytes, bool]:
    """What an entry keeps of ``upload`` (see ``Fingerprint.upload``), and whether the
    fitted ``size`` is not the file's own (read from its header; turned by EXIF counts
    as the same). Kept: a resized JPEG or PNG without its metadata (no GPS or camera
    details in the cache), if it is then small enough; else ``b""``."""
    if not upload:
        return b"", False
    try:
        with Image.open(io.BytesIO(upload), formats=ACCEPTED_FORMATS) as opened:
            resized = sorted(opened.size) != sorted(size)
    except Exception:  # noqa: BLE001 - it decoded once already; if not, keep nothing
        return b"", False
    kept = without_metadata(upload) if resized else b""
    return (kept if keepable_upload(kept) else b""), resized


def cell_hashes(image: Image.Image) -> np.ndarray:
    """A 16-bit hash (never 0) of each cell's RGB values on a CELL_SIDE grid; 0 for a cell
    of one flat colour (flat cells survive re-encoding, so they say nothing).

    The hash is a weighted sum of the cell's pixels (each packed into 24 bits) modulo
    2**32 with fixed odd weights (every instance must agree), so changing any one pixel
    changes the sum, then folded to 16 bits.
    """
    pixels = np.asarray(image.convert("RGB"))
    height, width = pixels.shape[:2]
    packed = (pixels[..., 0].astype(np.uint32) | pixels[..., 1].astype(np.uint32) << 8
              | pixels[..., 2].astype(np.uint32) << 16)
    rows, columns = (np.linspace(0, n, CELL_SIDE + 1).round().astype(int) for n in (height, width))
    starts = np.minimum(rows[:-1], height - 1), np.minimum(columns[:-1], width - 1)
    rng = np.random.default_rng(0xA1E6A7)
    row_weights, column_weights = (rng.integers(1, 2**31, size=n, dtype=np.uint32) * 2 + 1
                                   for n in (height, width))
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps: that is the modulo
        by_columns = np.add.reduceat(packed * column_weights, starts[1], axis=1, dtype=np.uint32)
        sums = np.add.reduceat(by_columns * row_weights[:, None], starts[0], axis=0,
                               dtype=np.uint32)
    lowest = np.minimum.reduceat(np.minimum.reduceat(packed, starts[0], 0), starts[1], 1)
    highest = np.maximum.reduceat(np.maximum.reduceat(packed, starts[0], 0), starts[1], 1)
    empty = (np.diff(rows)[:, None] == 0) | (np.diff(columns)[None, :] == 0)
    hashes = ((sums ^ (sums >> np.uint32(16))) & np.uint32(0xFFFF)).astype(np.uint16)
    return np.where((lowest == highest) | empty, 0, np.maximum(hashes, 1)).astype(np.uint16)


# -- stored bytes ----------------------------------------------------------------------
# Little-endian throughout, so every instance reads what any other wrote.

_MEMBER = struct.Struct("<4sddH16s")  # magic, created (Unix time), aspect, phash bytes, id
_MEMBER_MAGIC = b"AGF2"
_THUMB_DTYPE = np.dtype("<f4")
_THUMB_SHAPE = (THUMB_SIDE, THUMB_SIDE, 3)
_LUMA_SHAPE = (LUMA_SIDE, LUMA_SIDE)
_CHROMA_SHAPE = (CHROMA_SIDE, CHROMA_SIDE, 2)
_CELLS_SHAPE = (CELL_SIDE, CELL_SIDE)
_CELLS_DTYPE = np.dtype("<u2")
_GRIDS_BYTES = (math.prod(_THUMB_SHAPE) * _THUMB_DTYPE.itemsize + math.prod(_LUMA_SHAPE)
                + math.prod(_CHROMA_SHAPE) + math.prod(_CELLS_SHAPE) * _CELLS_DTYPE.itemsize)
_ENTRY = struct.Struct("<4sIII")  # magic, width, height, length of the result
_ENTRY_MAGIC = b"AGE2"
_PAGE = struct.Struct("<4sIIHHII")  # magic, width, height, then the four fields' lengths
_PAGE_MAGIC = b"AGP1"


class IndexMember(NamedTuple):
    """One cache entry as its namespace's index lists it."""

    created: float  # Unix time, comparable between instances
    entry_id: bytes  # 16 random bytes naming the entry's key
    fingerprint: Fingerprint


def phash_bytes(hash_size: int) -> int:
    """Bytes of a phash of ``hash_size`` (its hash_size² bits, packed)."""
    return (hash_size * hash_size + 7) // 8


def encode_member(member: IndexMember, hash_size: int) -> bytes:
    """The index member's bytes: header, phash, thumbnail, luma grid, colour grid."""
    fp = member.fingerprint
    size = phash_bytes(hash_size)
    return b"".join((
        _MEMBER.pack(_MEMBER_MAGIC, member.created, fp.aspect, size, member.entry_id),
        fp.phash.to_bytes(size, "big"),
        np.ascontiguousarray(fp.thumbnail, _THUMB_DTYPE).tobytes(),
        np.ascontiguousarray(fp.luma, np.uint8).tobytes(),
        np.ascontiguousarray(fp.chroma, np.uint8).tobytes(),
        np.ascontiguousarray(fp.cells, _CELLS_DTYPE).tobytes(),
    ))


def decode_member(blob: bytes, hash_size: int) -> IndexMember | None:
    """The member in ``blob``, or ``None`` if it is not one of ``hash_size`` (never raises)."""
    size = phash_bytes(hash_size)
    if not isinstance(blob, bytes) or len(blob) != _MEMBER.size + size + _GRIDS_BYTES:
        return None
    magic, created, aspect, stored_size, entry_id = _MEMBER.unpack_from(blob)
    if (magic != _MEMBER_MAGIC or stored_size != size or not math.isfinite(created)
            or not (math.isfinite(aspect) and aspect > 0)):
        return None
    offset = _MEMBER.size
    phash = int.from_bytes(blob[offset:offset + size], "big")
    offset += size
    arrays = []
    for shape, dtype in ((_THUMB_SHAPE, _THUMB_DTYPE), (_LUMA_SHAPE, np.uint8),
                         (_CHROMA_SHAPE, np.uint8), (_CELLS_SHAPE, _CELLS_DTYPE)):
        count = math.prod(shape)
        arrays.append(np.frombuffer(blob, dtype, count, offset).reshape(shape))
        offset += count * np.dtype(dtype).itemsize
    thumbnail, luma, chroma, cells = arrays
    if not np.isfinite(thumbnail).all():
        return None
    return IndexMember(created, entry_id,
                       Fingerprint(phash, thumbnail, aspect, luma, chroma, cells))


def encode_entry(data: bytes, size: tuple[int, int], source: bytes = b"") -> bytes:
    """An entry: header, the result, then its input as :func:`encode_source` wrote it."""
    return _ENTRY.pack(_ENTRY_MAGIC, *size, len(data)) + data + source


def decode_entry(blob: bytes | None) -> CachedResult | None:
    """The cached result in ``blob``, or ``None`` if there is none or it does not parse."""
    if not isinstance(blob, bytes) or len(blob) < _ENTRY.size:
        return None
    magic, width, height, length = _ENTRY.unpack_from(blob)
    end = _ENTRY.size + length
    if magic != _ENTRY_MAGIC or end > len(blob):
        return None
    return CachedResult(blob[_ENTRY.size:end], (width, height), blob[end:])


_PLAIN, _GRID, _STRICT, _UPLOAD = 0, 1, 2, 3  # the kept input's first byte
_UPLOAD_LENGTH = struct.Struct("<I")


def encode_source(image: Image.Image | None, grid: JpegGrid | None,
                  strict: bool = False, upload: bytes = b"") -> bytes:
    """An input as an entry keeps it: the uploaded file if ``upload`` (flagged, with its
    length), then whether it is an exact JPEG decode (then its grid) or strict (shares
    only identical pixels: see ``Fingerprint.strict``), then its pixels as lossless
    WebP. Empty without an image."""
    if image is None:
        return b""
    if upload:
        rest = encode_source(image, grid, strict)
        head = bytes([_UPLOAD]) + _UPLOAD_LENGTH.pack(len(upload))
        return head + upload + rest if rest else b""
    buffer = io.BytesIO()
    try:
        image.convert("RGB").save(buffer, "WEBP", lossless=True, quality=0, method=0)
    except (OSError, ValueError):  # e.g. a side over WebP's 16,383: keep no input
        return b""
    if grid is not None:
        head = bytes([_GRID]) + grid.pack()
    else:
        head = bytes([_STRICT if strict else _PLAIN])
    return head + buffer.getvalue()


def kept_upload(blob: bytes) -> tuple[bytes, bytes]:
    """The uploaded file :func:`encode_source` kept (``b""`` if none) and the rest of
    ``blob``."""
    if not blob or blob[0] != _UPLOAD or len(blob) < 1 + _UPLOAD_LENGTH.size:
        return b"", blob
    (length,) = _UPLOAD_LENGTH.unpack_from(blob, 1)
    start = 1 + _UPLOAD_LENGTH.size
    if len(blob) < start + length:
        return b"", b""
    return blob[start:start + length], blob[start + length:]


def decode_source(blob: bytes) -> tuple[JpegGrid | None, bool, bytes]:
    """The grid, the strict mark and the WebP bytes :func:`encode_source` wrote
    (``None, False, b""`` if there are none or they do not parse); a kept uploaded file
    before them is skipped (see :func:`kept_upload`)."""
    blob = kept_upload(blob)[1]
    if not blob or blob[0] not in (_PLAIN, _GRID, _STRICT):
        return None, False, b""
    if blob[0] != _GRID:
        return None, blob[0] == _STRICT, blob[1:]
    grid, offset = JpegGrid.unpack(blob, 1)
    return (grid, False, blob[offset:]) if grid is not None else (None, False, b"")


def encode_page(result: StoredResult) -> bytes:
    mimetype, style = result.mimetype.encode(), result.style.encode()
    return b"".join((_PAGE.pack(_PAGE_MAGIC, *result.size, len(mimetype), len(style),
                                len(result.original), len(result.result)),
                     mimetype, style, result.original, result.result))


def decode_page(blob: bytes | None) -> StoredResult | None:
    """The stored result page in ``blob``, or ``None`` if there is none or it does not parse."""
    if not isinstance(blob, bytes) or len(blob) < _PAGE.size:
        return None
    magic, width, height, *lengths = _PAGE.unpack_from(blob)
    if magic != _PAGE_MAGIC or _PAGE.size + sum(lengths) != len(blob):
        return None
    fields, offset = [], _PAGE.size
    for length in lengths:
        fields.append(blob[offset:offset + length])
        offset += length
    mimetype, style, original, result = fields
    try:
        return StoredResult(original, result, mimetype.decode(), style.decode(), (width, height))
    except UnicodeDecodeError:
        return None


# -- the near-duplicate cache ----------------------------------------------------------

@dataclass(frozen=True)
class CachedResult:
    data: bytes
    size: tuple[int, int]
    source: bytes = b""  # the input it was converted from (see encode_source)

    def same_source(self, fingerprint: Fingerprint) -> bool | None:
        """Whether ``fingerprint``'s input and this entry's are one JPEG re-save apart
        (``True``), that but edited in some cells (``False``), or neither can tell
        (``None``): see :mod:`flask_animegan.cache.jpeg_grid`. When both kept their uploaded
        files (JPEG or PNG, resized by the service), those are compared at their own
        resolution (:func:`flask_animegan.cache.jpeg_grid.same_upload`). If either is strict (a
        lossy WebP, or a resized upload whose file was not kept), only identical fitted
        pixels are the same (``True``), anything else ``False``. Costs nothing unless one
        of them kept its file, is an exact JPEG decode or is strict."""
        upload, _ = kept_upload(self.source)
        if upload and fingerprint.upload:
            verdict = same_upload(fingerprint.upload, upload)
            if verdict is not None:
                return verdict
        grid, strict, webp = decode_source(self.source)
        strict = strict or fingerprint.strict
        if fingerprint.source is None or not webp:
            return False if strict else None
        if not strict and grid is None and fingerprint.jpeg is None:
            return None
        try:
            with Image.open(io.BytesIO(webp), formats=("WEBP",)) as stored:
                if stored.size != fingerprint.source.size:  # from the header: no decode
                    return False if strict else None
                image = stored.convert("RGB")
        except Exception:  # noqa: BLE001 - a value that does not parse is skipped
            return False if strict else None
        if strict:
            return bool(np.array_equal(np.asarray(image),
                                       np.asarray(fingerprint.source.convert("RGB"))))
        return same_source(fingerprint.source, fingerprint.jpeg, image, grid)


class NearDuplicateCache:
    """Results keyed by (namespace, perceptual hash), shared only between near-identical inputs.

    A lookup hits when the phash distance is within ``max_distance``, the aspect
    ratios match, the colour thumbnails differ by at most ``color_tolerance`` (the
    grayscale phash alone cannot tell a photo from its hue-shifted copy) AND no small
    window differs by more than ``local_tolerance`` times the pair's re-encoding noise
    (the checks before it let a blurred or pixelated face through: the photo around
    it still matches), and the pair is not bit-identical outside some changed cells (a
    faint edit saved losslessly), and, when one input is an exact JPEG decode, the other
    re-encoded with its tables does not reproduce it in most cells but not all (a faint
    edit saved as JPEG: :mod:`flask_animegan.cache.jpeg_grid`, at the fitted size or, for
    uploads the service resized, at the files' own size); a lossy WebP, or a resized
    upload too large to keep whole, hits only identical pixels. Only the ``index_cap``
    newest entries of a namespace are
    candidates. Without ``storage``, entries live in a private ``MemoryStorage`` of
    ``max_bytes``. ``key`` (e.g. the app's secret key) keys the namespace digests.
    """

    def __init__(self, storage: Storage | None = None, *, ttl: float,
                 max_bytes: int | None = None, hash_size: int = 16, max_distance: int = 6,
                 color_tolerance: float = 0.9, local_tolerance: float = 1.75,
                 index_cap: int = 16, key: bytes = b"") -> None:
        if storage is None:
            if max_bytes is None:
                raise TypeError("NearDuplicateCache needs a storage or max_bytes")
            storage = MemoryStorage(max_bytes)
        self.storage = storage
        self.ttl = ttl
        self.enabled = ttl > 0 and index_cap > 0 and storage.max_bytes != 0
        self.hash_size = hash_size
        self.max_distance = max_distance
        self.color_tolerance = color_tolerance
        self.local_tolerance = local_tolerance
        self.index_cap = index_cap
        # BLAKE2b keys are at most 64 bytes; a digest of any secret fits
        self._key = hashlib.sha256(key).digest() if key else b""
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def fingerprint(self, image: Image.Image, upload: bytes = b"") -> Fingerprint:
        """``image``: the fitted input; ``upload``: the file it was decoded from (a JPEG
        or PNG the service resized is kept whole, for an exact check at its own size)."""
        return Fingerprint.of(image, self.hash_size, upload)

    def get(self, namespace: tuple[object, ...], fingerprint: Fingerprint) -> CachedResult | None:
        """The result of a near-identical input in ``namespace``, or ``None`` (a miss).

        Two storage round trips at most: the namespace's index, then the chosen entry.
        """
        if not self.enabled:
            return None
        digest = self._digest(namespace)
        found = None
        for entry_id in self._match(fingerprint, self.storage.index(f"index:{digest}",
                                                                    self.index_cap)):
            found = decode_entry(self.storage.get(f"entry:{digest}:{entry_id.hex()}"))
            if found is None:  # expired or evicted since: a miss
                break
            if found.same_source(fingerprint) is False:  # edited, or strict and not identical
                found = None
                continue
            break
        with self._lock:
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
        return found

    def _match(self, fingerprint: Fingerprint, members: list[bytes]) -> Iterator[bytes]:
        """The ids of the members that pass every check here, closest first."""
        oldest = time.time() - self.ttl  # the index outlives its older entries
        near = []
        for blob in members:  # newest first, so equal distances prefer the newest
            member = decode_member(blob, self.hash_size)
            if member is None or member.created < oldest:
                continue
            other = member.fingerprint
            distance = fingerprint.distance(other)
            if (distance <= self.max_distance
                    and abs(other.aspect / fingerprint.aspect - 1) <= ASPECT_TOLERANCE
                    and fingerprint.same_colors(other, self.color_tolerance)):
                near.append((distance, member.entry_id, other))
        # the local check costs ~2 ms, so it runs last, closest candidate first
        for _, entry_id, other in sorted(near, key=lambda found: found[0]):
            if fingerprint.same_locally(other, self.local_tolerance):
                yield entry_id

    def put(self, namespace: tuple[object, ...], fingerprint: Fingerprint, data: bytes,
            size: tuple[int, int]) -> None:
        """Keep ``data`` (``size`` pixels) for inputs near ``fingerprint``: one round trip."""
        if not self.enabled:
            return
        digest = self._digest(namespace)
        member = IndexMember(time.time(), secrets.token_bytes(16), fingerprint)
        source = encode_source(fingerprint.source, fingerprint.jpeg, fingerprint.strict,
                               fingerprint.upload)
        self.storage.set_indexed(f"entry:{digest}:{member.entry_id.hex()}",
                                 encode_entry(data, size, source), index=f"index:{digest}",
                                 member=encode_member(member, self.hash_size),
                                 ttl=self.ttl, cap=self.index_cap)

    def stats(self) -> dict[str, Any]:
        """Hits and misses of this process, and the storage's status (no round trip)."""
        with self._lock:
            counts = {"enabled": self.enabled, "hits": self.hits, "misses": self.misses}
        return {**counts, **self.storage.status()}

    def _digest(self, namespace: tuple[object, ...]) -> str:
        """The namespace as it appears in keys: a keyed digest, not the client's address."""
        text = json.dumps(list(namespace), separators=(",", ":"), default=str)
        return hashlib.blake2b(text.encode(), key=self._key, digest_size=16).hexdigest()


# -- the result pages ------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True)
class StoredResult:
    original: bytes  # JPEG of the (fitted) input, shown beside the result
    result: bytes
    mimetype: str
    style: str
    size: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """What keeping it costs in a ``MemoryStorage``."""
        return len(encode_page(self)) + ITEM_OVERHEAD


class ResultStore:
    """Results of form uploads for the post/redirect/get page, under unguessable ids.

    When ``storage`` cannot take a page (Redis down), the page is kept in a private
    ``MemoryStorage`` of ``max_bytes`` instead, so the form keeps working on this
    instance. Without ``storage``, pages live in a private ``MemoryStorage``.
    """

    def __init__(self, storage: Storage | None = None, *, ttl: float, max_bytes: int) -> None:
        self.storage = storage if storage is not None else MemoryStorage(max_bytes)
        self.ttl = ttl
        self.max_bytes = max_bytes
        self._fallback = (MemoryStorage(max_bytes) if self.storage.backend != "memory"
                          else None)

    def add(self, result: StoredResult) -> str:
        """Keep ``result`` for ``ttl`` seconds; returns its id (192 random bits, URL-safe)."""
        blob = encode_page(result)
        if len(blob) + ITEM_OVERHEAD > self.max_bytes:
            raise ImageTooLarge("the result is too large to keep for its page; choose a "
                                "smaller size or raise ANIMEGAN_RESULT_MAX_BYTES")
        token = secrets.token_urlsafe(24)
        if not self.storage.set(token, blob, self.ttl) and self._fallback is not None:
            self._fallback.set(token, blob, self.ttl)
        return token

    def get(self, token: str) -> StoredResult | None:
        """The result kept under ``token``, or ``None`` (unknown, expired, or unreachable)."""
        if not _TOKEN.fullmatch(token):  # not one of ours: no round trip
            return None
        # the fallback first: it costs no round trip, and ids are never reused
        blob = self._fallback.get(token) if self._fallback is not None else None
        return decode_page(blob if blob is not None else self.storage.get(token))
