"""Whether one input is a JPEG re-save of the other, or an edited copy of it: exactly.

A JPEG decoded at its own size (no reduced-scale decode, resize, crop, turn or colour
profile) is exactly what the decoder reconstructs from its quantised coefficients.
Encoding the other input with the same quantisation tables and chroma subsampling,
then decoding it, reproduces those pixels bit for bit when one input is a JPEG save of
the other (measured on every photo of ``bench/cache_privacy.py`` at q70-95: 0 pixels
differ). A copy edited before it was saved differs in the cells it changed, however
faintly: a blur of a night sky that changes it by under a level, which no statistic of
the pictures can tell from the noise JPEG adds, changes 4-27 of its 16x16 cells.

So when at least half of the textured cells come out identical, the pair has one
source, and any cell that differs was edited. When fewer do (another encoder, other
tables, a resized copy), there is no verdict and the statistical checks of
:mod:`flask_animegan.cache.near_duplicate` decide alone.

A JPEG the service shrinks has no pixels of its own size in the fitted picture, and
its coding noise, shrunk, is about as large as a faint blur of a flat region. So an
upload larger than the output (a JPEG or PNG of at most :data:`UPLOAD_MAX_BYTES` and
:data:`UPLOAD_MAX_PIXELS`, a phone's photo) is kept as its own file, without metadata,
and two such files of the same size, one of them a JPEG, are compared the same exact
way at their own resolution (:func:`same_upload`), in strips, one pair at a time.

Lossy WebP has no such check (its encoder's choices cannot be replayed from the file),
and its coding noise is larger than JPEG q90's, large enough to hide a pixelated patch
of a dark region from any statistic. A decoded lossy WebP is marked (:data:`LOSSY_KEY`)
and shares a result only with an input of identical pixels; so does an upload the service
resized whose file is too large to keep (``cache.Fingerprint.strict``).

Needs only Pillow and NumPy: the grid is read in the decode helper processes.
"""

from __future__ import annotations

import io
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, JpegImagePlugin

#: Where a decoded upload carries its grid (``Image.info``); absent when the pixels are
#: not the JPEG's own (resized, cropped, turned, colour-converted) or not a JPEG.
INFO_KEY = "animegan.jpeg_grid"

#: Set (True) on a decoded upload that was a lossy (VP8) WebP.
LOSSY_KEY = "animegan.lossy_webp"

_CHUNKS_WALKED = 64  # a real WebP has its image chunk within its first few (VP8X, ICCP...)

#: How a JPEG file (SOI, then a marker) and a PNG file begin.
JPEG_START = b"\xff\xd8\xff"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

#: A JPEG or PNG upload larger than the output is kept whole in its cache entry, for the
#: exact check at its own resolution, if it has at most this many bytes and pixels (and
#: no more scans than ``DecodeLimits``' default allows).
UPLOAD_MAX_BYTES = 8 * 1024 * 1024
UPLOAD_MAX_PIXELS = 12_600_000  # a 4080 x 3072 phone photo

CELL = 16  # pixels: one MCU at 4:2:0, four blocks at 4:4:4
SHARE = 0.5  # of textured cells identical: the two inputs have one source
MIN_CELLS = 16  # fewer textured cells than this (a flat picture): no verdict

_MODES = {"RGB": 3, "L": 1}
_TABLES_FOR_LAYERS = {"RGB": [0, 1, 1], "L": [0]}  # what Pillow's encoder writes
_HEADER = struct.Struct("<BbB")  # mode (1 or 3 bands), subsampling, number of tables


@dataclass(frozen=True)
class JpegGrid:
    """What re-encoding needs to reproduce a JPEG: its tables and chroma subsampling."""

    mode: str  # "RGB" (YCbCr in the file) or "L"
    subsampling: int  # Pillow's code: 0 (4:4:4), 1 (4:2:2), 2 (4:2:0); -1 for "L"
    qtables: tuple[tuple[int, ...], ...]  # 64 values each, in Pillow's (natural) order

    @classmethod
    def of(cls, image: Image.Image) -> JpegGrid | None:
        """The grid of an opened JPEG that Pillow's encoder can reproduce, else ``None``."""
        if not isinstance(image, JpegImagePlugin.JpegImageFile) or image.mode not in _MODES:
            return None
        try:
            tables = [tuple(int(v) for v in image.quantization[i])
                      for i in sorted(image.quantization)]
            layers = [layer[3] for layer in image.layer]
        except (AttributeError, KeyError, TypeError, ValueError, IndexError):
            return None
        sampling = JpegImagePlugin.get_sampling(image) if image.mode == "RGB" else -1
        grid = cls(image.mode, sampling, tuple(tables))
        if layers != _TABLES_FOR_LAYERS[image.mode] or len(tables) != max(layers) + 1:
            return None
        return grid if grid.valid() else None

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "subsampling": self.subsampling,
                "qtables": [list(t) for t in self.qtables]}

    @classmethod
    def from_json(cls, value: Any) -> JpegGrid | None:
        """The grid in ``value`` (from a decode helper), or ``None`` if it is not one."""
        try:
            grid = cls(str(value["mode"]), int(value["subsampling"]),
                       tuple(tuple(int(v) for v in t) for t in value["qtables"]))
        except (KeyError, TypeError, ValueError):
            return None
        return grid if grid.valid() else None

    def valid(self) -> bool:
        """Whether Pillow's encoder can take it: a known mode and its subsampling code,
        1-4 tables of 64 values in 1-65535."""
        return (self.mode in _MODES
                and self.subsampling in ((0, 1, 2) if self.mode == "RGB" else (-1,))
                and 1 <= len(self.qtables) <= 4
                and all(len(t) == 64 and all(1 <= v <= 65535 for v in t) for t in self.qtables))

    def pack(self) -> bytes:
        """Bytes for a cache entry: mode, subsampling, tables (little-endian uint16)."""
        head = _HEADER.pack(_MODES[self.mode], self.subsampling, len(self.qtables))
        return head + np.asarray(self.qtables, "<u2").tobytes()

    @classmethod
    def unpack(cls, blob: bytes, offset: int = 0) -> tuple[JpegGrid | None, int]:
        """The grid packed at ``offset`` and the offset after it (``None`` if malformed)."""
        if len(blob) < offset + _HEADER.size:
            return None, len(blob)
        bands, subsampling, count = _HEADER.unpack_from(blob, offset)
        offset += _HEADER.size
        end = offset + count * 128
        if len(blob) < end or not 1 <= count <= 4:
            return None, len(blob)
        tables = np.frombuffer(blob, "<u2", count * 64, offset).reshape(count, 64)
        mode = {3: "RGB", 1: "L"}.get(bands, "")
        grid = cls(mode, subsampling, tuple(tuple(int(v) for v in t) for t in tables))
        return (grid if grid.valid() else None), end

    def reencode(self, image: Image.Image) -> np.ndarray:
        """``image`` saved with this grid's tables and subsampling, decoded, as RGB pixels."""
        source = image.convert(self.mode)
        params: dict[str, Any] = {"qtables": [list(t) for t in self.qtables]}
        if self.mode == "RGB":
            params["subsampling"] = self.subsampling
        buffer = io.BytesIO()
        source.save(buffer, "JPEG", **params)
        with Image.open(buffer) as decoded:
            return np.asarray(decoded.convert("RGB"))


def is_lossy_webp(data: bytes) -> bool:
    """Whether the WebP file ``data`` holds lossy (VP8) image data: its first top-level
    chunks are walked; an animation, or a file whose image chunk is not among the first
    :data:`_CHUNKS_WALKED`, counts as lossy."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return False
    offset = 12
    for _ in range(_CHUNKS_WALKED):
        if offset + 8 > len(data):
            break
        fourcc = data[offset:offset + 4]
        (length,) = struct.unpack_from("<I", data, offset + 4)
        if fourcc == b"VP8L":
            return False
        if fourcc in (b"VP8 ", b"ANMF", b"ANIM"):
            return True
        offset += 8 + length + (length & 1)
    return True


def grid_of(image: Image.Image) -> JpegGrid | None:
    """The grid a decoded upload carries (see :data:`INFO_KEY`)."""
    grid = image.info.get(INFO_KEY)
    return grid if isinstance(grid, JpegGrid) else None


def same_source(first: Image.Image, first_grid: JpegGrid | None,
                second: Image.Image, second_grid: JpegGrid | None) -> bool | None:
    """``True`` if one input is the other saved as JPEG (or identical), ``False`` if it is
    that except in some cells (edited before saving), ``None`` if this cannot tell.

    Each input that is an exact JPEG decode is tried as a re-save of the other. The
    re-encoding runs in strips of :data:`STRIP` rows, so a large picture needs little
    memory beyond the two decodes (JPEG codes each MCU row on its own; the decoder's
    smoothing of colour across rows only reaches into the strip's margins, which are
    not compared).
    """
    if first.size != second.size:
        return None
    if all(np.array_equal(*rows) for rows in zip(_strips(first), _strips(second))):
        return True
    verdicts = []
    for grid, source, target in ((first_grid, second, first), (second_grid, first, second)):
        if grid is None:
            continue
        try:
            verdict = _resave_agrees(grid, source, target)
        except (OSError, ValueError, TypeError):  # tables Pillow's encoder refuses
            continue
        if verdict:
            return True
        verdicts.append(verdict)
    return False if False in verdicts else None


STRIP = 256  # rows re-encoded and compared at a time: a multiple of CELL and of the MCU
_MARGIN = 16  # rows re-encoded above and below a strip and not compared


def _strips(image: Image.Image) -> Iterator[np.ndarray]:
    """``image``'s RGB pixels, :data:`STRIP` rows at a time."""
    for top in range(0, image.height, STRIP):
        yield np.asarray(image.crop((0, top, image.width, min(image.height, top + STRIP)))
                         .convert("RGB"))


def _resave_agrees(grid: JpegGrid, source: Image.Image, target: Image.Image) -> bool | None:
    """Whether ``source`` re-encoded with ``grid`` is ``target`` in every CELL x CELL cell
    (``None`` unless most textured ones are): see :func:`_cell_counts`."""
    width, height = target.size
    textured = identical = 0
    differ = False
    for top, expected in zip(range(0, height, STRIP), _strips(target)):
        low, bottom = max(0, top - _MARGIN), top + expected.shape[0]
        high = min(height, bottom + _MARGIN)
        decoded = grid.reencode(source.crop((0, low, width, high)))
        counts = _cell_counts(decoded[top - low:bottom - low], expected)
        textured, identical, differ = (textured + counts[0], identical + counts[1],
                                       differ or counts[2])
    if textured < MIN_CELLS or identical < SHARE * textured:
        return None
    return not differ


def _cell_counts(candidate: np.ndarray, target: np.ndarray) -> tuple[int, int, bool]:
    """Over the CELL x CELL cells of two equal pixel arrays: how many are textured (not one
    flat colour in either), how many of those are identical, and whether any cell differs."""
    height, width = target.shape[:2]
    rows, columns = -(-height // CELL), -(-width // CELL)

    def cells(pixels: np.ndarray) -> np.ndarray:
        padded = np.zeros((rows * CELL, columns * CELL, 3), np.uint8)
        padded[:height, :width] = pixels
        padded[height:, :] = padded[height - 1:height, :]  # edge cells stay flat if flat
        padded[:, width:] = padded[:, width - 1:width]
        grid: np.ndarray = padded.reshape(rows, CELL, columns, CELL, 3).transpose(0, 2, 1, 3, 4)
        return grid

    new, old = cells(candidate), cells(target)
    differ = (new != old).any(axis=(2, 3, 4))
    textured = ((new != new[:, :, :1, :1]).any(axis=(2, 3, 4))
                | (old != old[:, :, :1, :1]).any(axis=(2, 3, 4)))
    return int(textured.sum()), int((textured & ~differ).sum()), bool(differ.any())


# one whole-size check at a time in a process: each holds about 130 MiB at 12 megapixels
_WHOLE_SIZE_CHECK = threading.Lock()
WHOLE_SIZE_WAIT = 2.0  # seconds a check waits for another to finish, then says "differ"


def keepable_upload(data: bytes) -> bool:
    """Whether ``data`` is small enough, and looks enough like a JPEG or PNG, to keep whole."""
    return (data.startswith(JPEG_START) or data.startswith(PNG_SIGNATURE)) \
        and len(data) <= UPLOAD_MAX_BYTES


def same_upload(first: bytes, second: bytes) -> bool | None:
    """:func:`same_source` for two kept files, at their own resolution: ``None`` unless
    both are keepable, 8-bit RGB or gray, of the same size within the pixel and scan
    limits, and one is a JPEG (each is decoded whole and a JPEG one re-encodes the other:
    about 40 ms a megapixel). One runs at a time in a process, so the memory they hold
    (about 130 MiB at the pixel limit) is bounded whatever the number of threads; one
    that waits over :data:`WHOLE_SIZE_WAIT` for another says ``False`` (the caller misses:
    a cost under load, never a shared result that no check approved)."""
    from ..inputs.decoding import (  # decoding imports this module
        DecodeLimits,
        count_jpeg_scans,
    )

    if first == second:
        return True
    opened = []
    try:
        for data in (first, second):
            if not keepable_upload(data) or (data.startswith(JPEG_START) and
                                             count_jpeg_scans(data) > DecodeLimits.max_scans):
                return None
            image = Image.open(io.BytesIO(data), formats=("JPEG", "PNG"))
            if image.width * image.height > UPLOAD_MAX_PIXELS or image.mode not in _MODES:
                return None
            opened.append(image)
        if opened[0].size != opened[1].size:
            return None
        grids = [JpegGrid.of(image) for image in opened]
        if grids == [None, None]:
            return None
        if not _WHOLE_SIZE_CHECK.acquire(timeout=WHOLE_SIZE_WAIT):
            return False
        try:
            for image in opened:
                image.load()
            return same_source(opened[0], grids[0], opened[1], grids[1])
        finally:
            _WHOLE_SIZE_CHECK.release()
            for image in opened:
                image.close()
    except Exception:  # noqa: BLE001 - a file that does not decode gives no verdict
        return None
