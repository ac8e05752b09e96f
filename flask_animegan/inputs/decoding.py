"""Untrusted upload bytes to a small, upright RGB picture, within stated budgets; what costs
nothing (format, pixels, aspect, peak memory, JPEG scans) is checked from the header first.
Pillow and NumPy only: it also runs in the helper process."""

from __future__ import annotations

import contextlib
import io
import math
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from PIL import Image, ImageCms, ImageFile, UnidentifiedImageError

from ..config import DecodeLimits as DecodeLimits
from ..errors import BadImage, ConversionError, ImageTooLarge, UnsupportedImage

#: Formats accepted from uploads, decided by content (Pillow's signature checks).
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
ACCEPTED_HINT = "send a JPEG, PNG, WebP, GIF, BMP or TIFF image"

#: Bytes per pixel of Pillow's storage for a mode (RGB is stored in 4 bytes).
_ONE_BYTE_MODES = frozenset({"1", "L", "P"})
_RGB_BYTES = 4


#: A JPEG larger than the output is decoded at the smallest DCT scale that keeps at least
#: the output's pixels (docs/benchmark.md: what it saves and what it changes).
DRAFT_MARGIN = 1.25
#: Pillow's ``reducing_gap`` for every fit: a large reduction first averages whole blocks.
REDUCING_GAP = 3.0


@dataclass(frozen=True)
class DecodedUpload:
    """A decode's result, here or from a helper process."""

    #: The upright RGB picture fitted to the requested size: what the network sees.
    image: Image.Image
    #: The file's own width and height, after its EXIF orientation.
    source_size: tuple[int, int]
    #: The format found in the content: one of :data:`ACCEPTED_FORMATS`.
    format: str


# -- what a decode costs ------------------------------------------------------------------
# Each term is a buffer alive at the decode's peak on decode_upload's path: the decoder's
# own buffers, each conversion step's input and output, then the resize.
# tests/test_decode_memory.py measures every path's peak against this estimate.

#: Bytes Pillow keeps for each JPEG marker segment it reads before the first scan.
JPEG_SEGMENT_BYTES = 128
#: libwebp's animation decoder (Pillow's only WebP reader) keeps two RGBA canvases of
#: its own, the frame and the disposed previous frame, for as long as the file is open.
_WEBP_CANVASES = 2
#: Rows of a high-bit-depth or float image are brought to 8 bits this many pixels at
#: a time, so the float temporaries stay small (about 20 bytes a pixel of the band).
_GRAY_BAND_PIXELS = 1 << 16
#: What parsing and applying an ICC profile costs beside the pixels: lcms's tables for
#: the transform, and a few copies of the profile itself.
_ICC_FIXED_BYTES = 2 << 20
_ICC_PROFILE_COPIES = 4


def storage_bytes(mode: str) -> int:
    """Bytes per pixel Pillow allocates for an image of ``mode``."""
    if mode in _ONE_BYTE_MODES:
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


def decode_bytes_needed(image: ImageFile.ImageFile, opened: OpenedUpload, *, size: int,
                        square: bool, cover: bool, source_size: tuple[int, int]) -> int:
    """The peak memory of decoding ``image`` (opened, a JPEG after its draft) into the
    fitted RGB picture: what ``max_bytes`` limits."""
    width, height = image.size
    area = width * height
    kept = opened.kept
    persistent, transient = _decoder_bytes(image, opened.multi_scan, source_size)
    to_rgb_bytes = area * _conversion_bytes_per_pixel(image)
    if image.mode.startswith("I") or image.mode == "F":
        to_rgb_bytes += 20 * _GRAY_BAND_PIXELS
    icc = image.info.get("icc_profile")
    if icc and image.mode in _ICC_MODES:
        kept += _ICC_FIXED_BYTES + _ICC_PROFILE_COPIES * len(icc)
    resize, out = _fit_bytes(width, height, size, square, cover, source_size)
    # Pillow's getexif reads EXIF, XMP, and a PNG's eXIf chunk, which may follow the pixels
    turn = out if image.format == "PNG" or {"exif", "xmp", "XML:com.adobe.xmp"} & set(
        image.info) else 0
    stages = (persistent + transient + area * storage_bytes(image.mode),  # loading
              persistent + to_rgb_bytes,  # to RGB, the file still open
              _RGB_BYTES * area + resize,  # fitting, the file closed
              out + turn)  # the EXIF turn of the fitted image
    return max(stages) + kept


def _decoder_bytes(image: ImageFile.ImageFile, multi_scan: bool,
                   source_size: tuple[int, int]) -> tuple[int, int]:
    """The decoder's own buffers: (alive until the file is closed, alive while loading)."""
    width, height = image.size
    codec = image.tile[0][0] if image.tile else ""
    if image.format == "WEBP":
        # the canvases, then the frame handed over as bytes while Pillow copies it in;
        # with alpha, 4 bytes a pixel more
        canvases = (_WEBP_CANVASES + (image.mode == "RGBA")) * 4 * width * height
        return canvases, 4 * width * height
    if image.format == "JPEG" and (multi_scan or image.info.get("progressive")):
        return 0, _jpeg_coefficient_bytes(image, *source_size)
    if codec == "libtiff":
        return 0, _tiff_strip_bytes(image)
    if codec == "bmp_rle":
        # the whole image expanded into a bytearray (grown by an eighth), then its copy
        return 0, math.ceil(2.25 * width * height)
    return 0, 0


def _jpeg_coefficient_bytes(image: Image.Image, width: int, height: int) -> int:
    """A progressive or multi-scan JPEG keeps every DCT coefficient (2 bytes, 64 a block)
    of every component at the file's full size, whatever the draft scale."""
    layers = getattr(image, "layer", None) or [("", 1, 1, 0)] * len(image.getbands())
    sampling = [(int(layer[1]), int(layer[2])) for layer in layers]
    h_max, v_max = max(h for h, _ in sampling), max(v for _, v in sampling)
    mcu_columns, mcu_rows = math.ceil(width / (8 * h_max)), math.ceil(height / (8 * v_max))
    return 128 * sum(mcu_columns * h * mcu_rows * v for h, v in sampling)


def _tiff_strip_bytes(image: Image.Image) -> int:
    """libtiff decodes one strip or tile at a time into a buffer of its own: at least 4
    bytes a pixel (RGBA for YCbCr), more for wide samples, and a JPEG's coefficients."""
    width, height = image.size
    tags = getattr(image, "tag_v2", {})
    bits = tags.get(258, (8,))
    bits = bits if isinstance(bits, tuple) else (bits,)
    sample_bytes = math.ceil(sum(int(b) for b in bits) * max(1, int(tags.get(277, 1)))
                             / max(1, len(bits)) / 8)
    if 322 in tags and 323 in tags:
        pixels = int(tags[322]) * int(tags[323])
    else:
        pixels = width * min(height, int(tags.get(278, height)) or height)
    jpeg = 10 if tags.get(259) in (6, 7) else 0
    return pixels * (max(4, sample_bytes) + jpeg)


_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "La", "RGBa"})
#: Modes that paste onto RGB with their own alpha as the mask, without an RGBA copy.
_PASTE_MODES = frozenset({"RGBA", "LA"})
_ICC_MODES = frozenset({"RGB", "RGBA", "CMYK", "L"})


def _conversion_bytes_per_pixel(image: Image.Image) -> int:
    """The most bytes a pixel that :func:`to_rgb` needs at once, the step's input and
    its output alive together (the path of :func:`to_rgb`, step by step)."""
    mode, current = image.mode, storage_bytes(image.mode)
    peak = current
    alpha = mode in _ALPHA_MODES or "transparency" in image.info
    if mode.startswith("I") or mode == "F":
        peak, current, mode, alpha = current + 1, 1, "L", False  # to 8-bit gray
    elif image.info.get("icc_profile") and mode in _ICC_MODES:
        mode = "RGBA" if mode == "RGBA" else "RGB"
        peak, current = max(peak, current + _RGB_BYTES), _RGB_BYTES
    if alpha and mode not in _PASTE_MODES:
        peak, current = max(peak, current + _RGB_BYTES), _RGB_BYTES  # the RGBA copy
    if alpha or mode != "RGB":
        peak = max(peak, current + _RGB_BYTES)  # the RGB image
    return peak


def _fit_bytes(width: int, height: int, size: int, square: bool, cover: bool,
               source_size: tuple[int, int]) -> tuple[int, int]:
    """What :func:`fit` allocates (a crop, or Pillow's reduce, its horizontal pass and the
    output) and the output's own bytes."""
    box_width, box_height = (min(width, height),) * 2 if square else (width, height)
    full = (min(source_size),) * 2 if square else source_size
    target_width, target_height = output_size(*full, size, cover=cover)
    out = _RGB_BYTES * target_width * target_height
    if (target_width, target_height) == (box_width, box_height):
        return out if square else 0, out
    factor_x = int(box_width / target_width / REDUCING_GAP) or 1
    factor_y = int(box_height / target_height / REDUCING_GAP) or 1
    reduced = 0
    if factor_x > 1 or factor_y > 1:
        box_width, box_height = -(-box_width // factor_x), -(-box_height // factor_y)
        reduced = box_width * box_height
    return _RGB_BYTES * (reduced + target_width * box_height) + out, out


# -- JPEG scans ----------------------------------------------------------------------
_SOI, _SOS, _EOI = 0xD8, 0xDA, 0xD9
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn carry no length
# In entropy-coded data 0xFF is followed by 0x00 (stuffing) or RSTn; anything else is a marker.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")


@dataclass(frozen=True)
class JpegLayout:
    """What walking a JPEG's segments tells, before Pillow reads it."""

    #: SOS markers in the file.
    scans: int
    #: Marker segments before the first scan (Pillow keeps a tuple for each).
    segments: int
    #: Bytes of their payloads (Pillow keeps a copy of each, and joins ICC chunks).
    payload: int

    @property
    def kept_bytes(self) -> int:
        """What Pillow holds of this file's metadata once it is open."""
        return self.segments * JPEG_SEGMENT_BYTES + 2 * self.payload


def jpeg_layout(data: bytes) -> JpegLayout:
    """Walk the segments of the JPEG in ``data`` without decoding, skipping by length fields
    and entropy-coded data to its next marker (a truncated file counts what was seen)."""
    scans = segments = payload = 0
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            found = _NEXT_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
            continue
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == _EOI:
            break
        if marker in _STANDALONE or marker == _SOI:
            pos += 2
            continue
        (length,) = struct.unpack_from(">H", data, pos + 2)
        pos += 2 + length
        if marker == _SOS:
            scans += 1
            found = _NEXT_MARKER.search(data, pos)
            if found is None:
                break
            pos = found.start()
        elif not scans:
            segments += 1
            payload += length
    return JpegLayout(scans, segments, payload)


# -- the decode ------------------------------------------------------------------------
@dataclass(frozen=True)
class OpenedUpload:
    """An upload opened lazily by :func:`open_upload`, with what it costs before its pixels."""

    image: ImageFile.ImageFile
    #: Bytes Pillow holds of the file beside the pixels: metadata, copies of the file.
    kept: int
    #: A JPEG with more than one scan (or progressive): libjpeg keeps all its coefficients.
    multi_scan: bool = False


#: Copies of the file a reader makes (WebP: Pillow's and libwebp's; GIF: its joined
#: comments; TIFF: see :func:`_tiff_file_copies`).
_FILE_COPIES = {"WEBP": 2, "GIF": 2}


def _tiff_file_copies(image: ImageFile.ImageFile) -> int:
    """libtiff is handed the whole file as one copy; the raw reader reads one strip (and
    joins it to what is left of the last) at a time, or 64 KiB blocks of a single one."""
    if image.tile and image.tile[0][0] == "libtiff":
        return 1
    return 2 if len(image.tile) > 1 else 0


def webp_canvas(data: bytes) -> tuple[int, int] | None:
    """The canvas an extended WebP (``VP8X``: animations, alpha, metadata) declares, as
    (width, height); None for any other file."""
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:16] != b"WEBPVP8X":
        return None
    return (1 + int.from_bytes(data[24:27], "little"),
            1 + int.from_bytes(data[27:30], "little"))


def open_upload(data: bytes, limits: DecodeLimits, hint: str = ACCEPTED_HINT) -> OpenedUpload:
    """Open ``data`` lazily and check everything the header tells; no pixel is decoded.
    ``hint``: what the errors for a file that is no image at all tell the sender to send."""
    if not data:
        raise BadImage(f"the upload is empty; {hint}")
    layout = jpeg_layout(data) if data.startswith(b"\xff\xd8\xff") else None
    if layout is not None and layout.kept_bytes > limits.max_bytes:
        # checked before Pillow reads the segments: it keeps a tuple for each
        raise ImageTooLarge(f"the JPEG has {layout.segments:,} metadata segments; reading "
                            f"them needs {layout.kept_bytes >> 20} MiB, the limit is "
                            f"{limits.max_bytes >> 20} MiB. Save it again without them")
    canvas = webp_canvas(data)
    if canvas is not None and canvas[0] * canvas[1] > limits.max_pixels:
        # checked before Pillow: libwebp may refuse such a header as corrupt, or hold the
        # canvas it declares
        raise ImageTooLarge(f"the image is {canvas[0]}x{canvas[1]} = "
                            f"{canvas[0] * canvas[1]:,} pixels; the limit is "
                            f"{limits.max_pixels:,}. Send a smaller image")
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(data, hint) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge(f"the image has too many pixels; the limit is "
                            f"{limits.max_pixels:,}") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for corrupt headers
        raise corrupt("image", exc, hint) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise BadImage("the image has no pixels")
    if width * height > limits.max_pixels:
        raise ImageTooLarge(f"the image is {width}x{height} = {width * height:,} pixels; "
                            f"the limit is {limits.max_pixels:,}. Send a smaller image")
    if max(width, height) > limits.max_aspect * min(width, height):
        raise ImageTooLarge(f"the image is {width}x{height}: one side is more than "
                            f"{limits.max_aspect:g} times the other. Crop it and send it again")
    if image.format == "GIF":
        _check_gif_frame(image)
    if image.format == "JPEG":
        layout = layout or jpeg_layout(data)
        if layout.scans > limits.max_scans:
            raise ImageTooLarge(f"the JPEG has {layout.scans:,} scans; at most "
                                f"{limits.max_scans} are accepted. Save it again as a "
                                "baseline JPEG")
        return OpenedUpload(image, layout.kept_bytes, layout.scans > 1)
    if image.format == "PNG":
        return OpenedUpload(image, png_kept_bytes(data))
    if image.format == "TIFF":
        return OpenedUpload(image, _tiff_file_copies(image) * len(data))
    return OpenedUpload(image, _FILE_COPIES.get(cast(str, image.format), 0) * len(data))


# Pillow's limits on PNG text: each compressed chunk inflates to at most MAX_TEXT_CHUNK,
# all text together to at most MAX_TEXT_MEMORY (it then refuses the file).
_PNG_TEXT = frozenset({b"tEXt", b"zTXt", b"iTXt"})


def png_kept_bytes(data: bytes) -> int:
    """What Pillow holds of a PNG beside its pixels: its text (compressed text counted at
    the most it may inflate to), profile and EXIF, from the chunk headers alone."""
    from PIL import PngImagePlugin

    chunk_limit, text_limit = PngImagePlugin.MAX_TEXT_CHUNK, PngImagePlugin.MAX_TEXT_MEMORY
    text = other = 0
    pos, end = 8, len(data)
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind in _PNG_TEXT:
            text += length if kind == b"tEXt" else chunk_limit
        elif kind == b"iCCP":
            other += chunk_limit
        elif kind == b"eXIf":
            other += 2 * length
        elif kind == b"IEND":
            break
        pos += 12 + length
    # the text as str, one chunk's bytes on the way
    return min(text, text_limit) + chunk_limit * (text > 0) + other


#: A GIF's first frame may leave part of its screen empty, but not most of a large one:
#: Pillow allocates the whole screen, so a tiny file could cost hundreds of megabytes.
GIF_EMPTY_SCREEN_PIXELS = 1_000_000


def _check_gif_frame(image: ImageFile.ImageFile) -> None:
    width, height = image.size
    try:
        box = image.tile[0][1]
    except (IndexError, TypeError):
        return  # no frame: the decoder reports it
    if box is None or len(box) != 4:
        return
    x0, y0, x1, y1 = box
    frame = max(0, x1 - x0) * max(0, y1 - y0)
    if width * height > GIF_EMPTY_SCREEN_PIXELS and frame * 4 < width * height:
        raise ImageTooLarge(f"the GIF's screen is {width}x{height} but its first frame only "
                            f"{x1 - x0}x{y1 - y0}; save it again without the empty screen")


def decode_upload(data: bytes, limits: DecodeLimits, *, size: int, square: bool = False,
                  cover: bool = False) -> DecodedUpload:
    """``data`` decoded, upright and fitted (see :func:`fit`); raises BadImage (400),
    ImageTooLarge (413) or UnsupportedImage (415) with a message for the sender."""
    opened, needed, source_size = _open_and_plan(data, limits, size, square, cover)
    image = opened.image
    fmt = image.format
    width, height = source_size
    with failures("the image", lambda exc: corrupt(fmt, exc)):
        if needed > limits.max_bytes:
            raise ImageTooLarge(
                f"decoding this {width}x{height} {image.mode} {fmt} image needs "
                f"{needed >> 20} MiB; the limit is {limits.max_bytes >> 20} MiB. Send a "
                "smaller image (fewer pixels or 8 bits per channel)")
        orientation = _orientation(image)
        image.load()  # the first frame of an animation
        rgb = _to_rgb(image, release=True)
        del image, opened  # and with them the decoder's own buffers (libwebp's canvases)
        fitted = fit(rgb, size, square=square, cover=cover, source_size=source_size)
        del rgb
        if orientation in _TRANSPOSE:
            fitted = fitted.transpose(_TRANSPOSE[orientation])
        if orientation in _TURNS:
            width, height = height, width
        return DecodedUpload(fitted, (width, height), cast(str, fmt))


def decode_cost(data: bytes, *, size: int, square: bool = False, cover: bool = False,
                limits: DecodeLimits | None = None) -> int:
    """The peak memory :func:`decode_upload` counts for ``data``, without decoding a pixel
    (for tests and tools)."""
    limits = limits or DecodeLimits(max_pixels=10**12, max_bytes=1 << 62,
                                    max_aspect=1e9, max_scans=10**9)
    return _open_and_plan(data, limits, size, square, cover)[1]


def _open_and_plan(data: bytes, limits: DecodeLimits, size: int, square: bool,
                   cover: bool) -> tuple[OpenedUpload, int, tuple[int, int]]:
    """The opened upload (a large JPEG set to its reduced DCT scale), its peak memory
    and the file's own size."""
    if square and cover:
        raise ValueError("a fit is square or covers the size, not both")
    opened = open_upload(data, limits)
    image = opened.image
    source_size = width, height = image.size
    try:
        if image.format == "JPEG":
            short = square or cover
            scale = DRAFT_MARGIN * size / (min(width, height) if short else max(width, height))
            if scale < 1:
                image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        needed = decode_bytes_needed(image, opened, size=size, square=square, cover=cover,
                                     source_size=source_size)
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for corrupt data
        raise corrupt(image.format, exc) from None
    return opened, needed, source_size


def centre_square(size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The box of the centre square of a picture of ``size``."""
    width, height = size
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def fitted_size(source_size: tuple[int, int], size: int, square: bool = False,
                cover: bool = False) -> tuple[int, int]:
    """The size :func:`decode_upload` fits an upload of ``source_size`` to."""
    width, height = source_size
    if square:
        width = height = min(width, height)
    return output_size(width, height, size, cover=cover)


@contextlib.contextmanager
def failures(what: str, corrupt: Callable[[BaseException], BadImage]) -> Iterator[None]:
    """Whatever a decoder raises inside becomes a ConversionError: running out of memory
    a 413 for ``what``, anything else ``corrupt(exc)`` (Pillow and FFmpeg raise many types)."""
    try:
        yield
    except ConversionError:
        raise
    except MemoryError:
        raise ImageTooLarge(f"{what} needs more memory to decode than this server allows; "
                            "send a smaller one") from None
    except Exception as exc:  # noqa: BLE001
        raise corrupt(exc) from None


def corrupt(fmt: str | None, exc: BaseException, hint: str = ACCEPTED_HINT) -> BadImage:
    return BadImage(f"the {fmt or 'image'} file is truncated or corrupt and cannot be "
                    f"decoded ({exc.__class__.__name__}); {hint}")


def _unidentified(data: bytes, hint: str) -> Exception:
    """415 for an image in a format we do not accept, 400 for anything else."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            fmt = other.format
    except Exception:  # noqa: BLE001 - not an image at all
        return BadImage(f"the file is not an image this server can read; {hint}")
    return UnsupportedImage(f"{fmt} images are not accepted; {hint}")


# -- orientation -----------------------------------------------------------------------
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
              4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
              6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}
_TURNS = frozenset({5, 6, 7, 8})  # the orientations that swap width and height


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8), or 1 when absent or unreadable."""
    try:
        value = image.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a corrupt EXIF block only loses the orientation
        return 1
    return value if isinstance(value, int) and value in _TRANSPOSE else 1


# -- colour ----------------------------------------------------------------------------
_SRGB = ImageCms.createProfile("sRGB")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any mode to RGB in sRGB, alpha over white; high-bit-depth and float pictures are brought
    to 8 bits a band of rows at a time (16-bit samples keep their top byte, others are scaled
    by their range). ``image`` itself is left as it was."""
    return _to_rgb(image, release=False)


def _to_rgb(image: Image.Image, *, release: bool) -> Image.Image:
    """:func:`to_rgb`; with ``release``, each image (``image`` too) is closed as soon as
    the next step's output exists, so no more than two are alive at once."""

    def step(new: Image.Image) -> Image.Image:
        if release and new is not image:
            image.close()
        return new

    if image.mode.startswith("I") or image.mode == "F":
        image = step(_to_8bit_gray(image))
    icc = image.info.get("icc_profile")
    if icc and image.mode in _ICC_MODES:
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            out_mode = "RGBA" if image.mode == "RGBA" else "RGB"
            # not in place, so a new image (typed Image | None for inPlace=True)
            image = step(cast(Image.Image, ImageCms.profileToProfile(
                image, source, _SRGB, outputMode=out_mode)))
        except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
            pass  # an unusable profile: keep the pixels as they are
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        if image.mode not in _PASTE_MODES:
            image = step(image.convert("RGBA"))
        rgb = Image.new("RGB", image.size, (255, 255, 255))
        rgb.paste(image, mask=image)  # the image's own alpha band is the mask
        image = step(rgb)
    elif image.mode != "RGB":
        image = step(image.convert("RGB"))
    image.info = {}  # drop EXIF, GPS, comments and the (now applied) ICC profile
    return image


def _to_8bit_gray(image: Image.Image) -> Image.Image:
    """An L image of a 16-bit, 32-bit or float one, converted a band of rows at a time."""
    width, height = image.size
    rows = max(1, _GRAY_BAND_PIXELS // width)
    bands = [(top, min(height, top + rows)) for top in range(0, height, rows)]

    def band(top: int, bottom: int) -> np.ndarray:
        array = np.asarray(image.crop((0, top, width, bottom)))
        if array.dtype.kind == "f":
            # one float32 copy (np.asarray of a Pillow image is read-only)
            return np.nan_to_num(array.astype(np.float32, copy=True), copy=False,
                                 nan=0.0, posinf=0.0, neginf=0.0)
        return array

    sixteen = image.mode.startswith("I;16")
    low = high = 0
    if not sixteen:
        for top, bottom in bands:
            array = band(top, bottom)
            if array.dtype == np.uint16:
                sixteen = True
                break
            low = min(low, array.min(initial=0))
            high = max(high, array.max(initial=0))
    out = np.empty((height, width), np.uint8)
    for top, bottom in bands:
        out[top:bottom] = _band_to_8bit(band(top, bottom), sixteen, low, high)
    return Image.fromarray(out, "L")


def _band_to_8bit(array: np.ndarray, sixteen: bool, low: float,
                  high: float) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """One band of rows to 8 bits, given the whole image's range (``low`` <= 0 <= ``high``)."""
    if sixteen:
        return (array >> 8).astype(np.uint8)
    if array.dtype.kind == "f":
        low, high = float(low), float(high)
        if low >= 0.0 and high <= 1.0:
            scaled = array * np.float32(255.0)
        elif low >= 0.0 and high <= 255.0:
            scaled = array
        else:
            scaled = (array - np.float32(low)) * np.float32(255.0 / max(high - low, 1e-12))
        clipped: np.ndarray[Any, Any] = np.clip(scaled, 0, 255, out=scaled)
        return clipped.astype(np.uint8)
    low, high = int(low), int(high)
    if low >= 0 and high <= 255:
        return array.astype(np.uint8)
    if low >= 0 and high <= 65535:  # 16-bit samples in a 32-bit image
        return (array >> 8).astype(np.uint8)
    span = np.float32(255.0 / max(high - low, 1))
    shifted = (array - low).astype(np.float32)
    return cast("np.ndarray[Any, np.dtype[np.uint8]]", (shifted * span).astype(np.uint8))


# -- size ------------------------------------------------------------------------------
def output_size(width: int, height: int, size: int, *, cover: bool = False) -> tuple[int, int]:
    """The fitted size of ``width`` x ``height``: the long side (with ``cover``, the short
    side) at most ``size``, the aspect kept, each side rounded and at least 1."""
    scale = min(1.0, size / (min(width, height) if cover else max(width, height)))
    return max(1, round(width * scale)), max(1, round(height * scale))


def fit(image: Image.Image, size: int, square: bool = False, cover: bool = False,
        source_size: tuple[int, int] | None = None) -> Image.Image:
    """The centre square if ``square``, downscaled by :func:`output_size`. ``source_size``:
    the file's size when ``image`` was decoded reduced (a JPEG draft), so the result is the
    same as from the full picture."""
    full_width, full_height = source_size or image.size
    box = (0, 0, image.width, image.height)
    if square:
        box = centre_square(image.size)
        full_width = full_height = min(full_width, full_height)
    target = output_size(full_width, full_height, size, cover=cover)
    if target == (box[2] - box[0], box[3] - box[1]):
        return image.crop(box) if square else image
    # the square as the resize's box: no full-size copy of the crop
    return image.resize(target, Image.Resampling.LANCZOS, box=box, reducing_gap=REDUCING_GAP)
