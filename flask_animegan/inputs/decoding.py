"""Decoding an untrusted upload into a small, upright RGB image, within stated budgets.

:func:`decode_upload` returns a :class:`DecodedUpload`. Everything here needs only
Pillow and NumPy (never torch nor Flask), because it also runs in the helper processes
of :mod:`flask_animegan.inputs.helper`. The checks that cost nothing come first, from
the file's header, before a pixel is decoded:

* the format is one we accept (decided by content, not by name or Content-Type);
* the area is within ``max_pixels`` and the aspect ratio within ``max_aspect``;
* the memory the decode needs (area x bytes per pixel of Pillow's storage, plus the
  RGB copy) is within ``max_bytes``: this counts bit depth and bands, not only pixels;
* a JPEG has at most ``max_scans`` scans (a progressive JPEG is decoded once per scan,
  so repeating a scan a thousand times makes a 200 KB file cost a minute of CPU).

Every other failure of the decoder, whatever Pillow raises, becomes :class:`BadImage`.

Sizing rule (documented in the README): the output keeps the input's aspect ratio;
its long side is ``min(input long side, size)``; each side is rounded to the nearest
pixel and is at least 1. Face styles first crop the centre square (as upstream's
``face2paint``), so their output is ``min(short side, size)`` square. Images are
never upscaled.
"""

from __future__ import annotations

import io
import math
import re
import struct
from dataclasses import dataclass
from typing import cast

import numpy as np
from PIL import Image, ImageCms, ImageFile, UnidentifiedImageError

from ..errors import BadImage, ImageTooLarge, UnsupportedImage

#: Formats accepted from uploads, decided by content (Pillow's signature checks).
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
ACCEPTED_HINT = "send a JPEG, PNG, WebP, GIF, BMP or TIFF image"

#: Bytes per pixel of Pillow's storage for a mode (RGB is stored in 4 bytes).
_ONE_BYTE_MODES = frozenset({"1", "L", "P"})
_RGB_BYTES = 4


#: A JPEG larger than the output is decoded at a reduced DCT scale no smaller than this
#: many times the output (measured with the cache's earlier bench: 12-megapixel photos
#: resized by 5 % shared a result 31 times in 40 at 1x, 38 at 3x, 40 without reduction;
#: decoding one takes 21, 31 and 66 ms at 256 px).
DRAFT_MARGIN = 3


@dataclass(frozen=True)
class DecodedUpload:
    """What a decode gives the rest of the service (and what a helper process sends back)."""

    #: The upright RGB image fitted to the requested size: what the network sees.
    image: Image.Image
    #: The file's own width and height in pixels, after its EXIF orientation.
    source_size: tuple[int, int]
    #: The format found in the file's content: one of :data:`ACCEPTED_FORMATS`.
    format: str


@dataclass(frozen=True)
class DecodeLimits:
    """What one decode may cost. The defaults match the ``ANIMEGAN_*`` defaults."""

    max_pixels: int = 40_000_000
    max_bytes: int = 192 * 1024 * 1024
    max_aspect: float = 20.0
    max_scans: int = 32


def storage_bytes(mode: str) -> int:
    """Bytes per pixel Pillow allocates for an image of ``mode``."""
    if mode in _ONE_BYTE_MODES:
        return 1
    if mode.startswith("I;16"):
        return 2
    return 4


def decode_bytes_needed(mode: str, width: int, height: int) -> int:
    """Memory a full decode plus its RGB copy needs (the budget ``max_bytes`` applies to)."""
    return width * height * (storage_bytes(mode) + (0 if mode == "RGB" else _RGB_BYTES))


# -- JPEG scans ----------------------------------------------------------------------
_SOI, _SOS, _EOI = 0xD8, 0xDA, 0xD9
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn carry no length
# In entropy-coded data 0xFF is followed by 0x00 (stuffing) or RSTn; anything else is a marker.
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7]")


def count_jpeg_scans(data: bytes) -> int:
    """Count the SOS markers of the JPEG in ``data`` by walking its segments (no decoding).

    Segments are skipped by their length fields and entropy-coded data up to its next
    marker, so bytes inside EXIF blocks or thumbnails are not counted. A truncated file
    counts the scans seen so far.
    """
    scans, pos, end = 0, 2, len(data)
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
    return scans


# -- the decode ------------------------------------------------------------------------
def open_upload(data: bytes, limits: DecodeLimits) -> Image.Image:
    """Open ``data`` lazily and check everything the header tells; no pixel is decoded."""
    if not data:
        raise BadImage(f"the upload is empty; {ACCEPTED_HINT}")
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(data) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge(f"the image has too many pixels; the limit is "
                            f"{limits.max_pixels:,}") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for corrupt headers
        raise _corrupt("image", exc) from None
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
        scans = count_jpeg_scans(data)
        if scans > limits.max_scans:
            raise ImageTooLarge(f"the JPEG has {scans:,} scans; at most {limits.max_scans} "
                                "are accepted. Save it again as a baseline JPEG")
    return image


#: A GIF's first frame may leave part of its screen empty, but not most of a large one:
#: Pillow allocates the whole screen, so a 29-byte file could cost 200 MB.
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


def decode_upload(data: bytes, limits: DecodeLimits, *, size: int,
                  square: bool = False) -> DecodedUpload:
    """Decode an upload into an upright RGB image fitted to ``size`` (see :func:`fit`).

    JPEGs are decoded with Pillow's ``draft`` at the smallest DCT scale that still gives
    :data:`DRAFT_MARGIN` times the output's size (a scale just above the output leaves
    block-grid aliasing that makes a 5 % resized copy of a 12-megapixel photo differ from
    it, locally, like an edit; Lanczos removes it over a 3x reduction). Raises BadImage
    (400), ImageTooLarge (413) or UnsupportedImage (415) with a message fit for the
    person who sent the file.
    """
    image = open_upload(data, limits)
    fmt = image.format
    try:
        width, height = image.size
        if fmt == "JPEG":
            scale = DRAFT_MARGIN * size / (min(width, height) if square else max(width, height))
            if scale < 1:
                image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        needed = decode_bytes_needed(image.mode, *image.size)
        if needed > limits.max_bytes:
            raise ImageTooLarge(
                f"decoding this {width}x{height} {image.mode} image needs {needed >> 20} MiB; "
                f"the limit is {limits.max_bytes >> 20} MiB. Send a smaller image (fewer "
                "pixels or 8 bits per channel)")
        orientation = _orientation(image)
        image.load()  # the first frame of an animation
        fitted = fit(to_rgb(image), size, square=square, source_size=(width, height))
        if orientation in _TRANSPOSE:
            fitted = fitted.transpose(_TRANSPOSE[orientation])
        if orientation in _TURNS:
            width, height = height, width
        return DecodedUpload(fitted, (width, height), cast(str, fmt))
    except (ImageTooLarge, BadImage, UnsupportedImage):
        raise
    except MemoryError:
        raise ImageTooLarge("the image needs more memory to decode than this server allows; "
                            "send a smaller image") from None
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for corrupt data
        raise _corrupt(fmt, exc) from None


def _corrupt(fmt: str | None, exc: BaseException) -> BadImage:
    return BadImage(f"the {fmt or 'image'} file is truncated or corrupt and cannot be "
                    f"decoded ({exc.__class__.__name__}); {ACCEPTED_HINT}")


def _unidentified(data: bytes) -> Exception:
    """415 for an image in a format we do not accept, 400 for anything else."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            fmt = other.format
    except Exception:  # noqa: BLE001 - not an image at all
        return BadImage(f"the file is not an image this server can read; {ACCEPTED_HINT}")
    return UnsupportedImage(f"{fmt} images are not accepted; {ACCEPTED_HINT}")


# -- orientation -----------------------------------------------------------------------
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
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
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "La", "RGBa"})


def to_rgb(image: Image.Image) -> Image.Image:
    """Any mode (1, L, LA, P, RGBA, CMYK, I;16, I, F, ...) to RGB in sRGB, alpha over white.

    High-bit-depth and float images are brought to 8 bits without full-size float64
    copies: 16-bit samples keep their top byte, other integer and float images are
    scaled by their range (floats within [0, 1] by 255).
    """
    if image.mode.startswith("I") or image.mode == "F":
        image = _to_8bit_gray(image)
    icc = image.info.get("icc_profile")
    if icc and image.mode in ("RGB", "RGBA", "CMYK", "L"):
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            out_mode = "RGBA" if image.mode == "RGBA" else "RGB"
            # not in place, so a new image (typed Image | None for inPlace=True)
            image = cast(Image.Image, ImageCms.profileToProfile(image, source, _SRGB,
                                                                outputMode=out_mode))
        except (ImageCms.PyCMSError, OSError, ValueError, TypeError):
            pass  # an unusable profile: keep the pixels as they are
    if image.mode in _ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    else:
        rgb = image.convert("RGB") if image.mode != "RGB" else image
    rgb.info = {}  # drop EXIF, GPS, comments and the (now applied) ICC profile
    return rgb


def _to_8bit_gray(image: Image.Image) -> Image.Image:
    array = np.asarray(image)
    if image.mode.startswith("I;16") or array.dtype == np.uint16:
        return Image.fromarray((array >> 8).astype(np.uint8), "L")
    if array.dtype.kind == "f":
        # one float32 copy (np.asarray of a Pillow image is read-only)
        array = np.nan_to_num(array.astype(np.float32, copy=True), copy=False,
                              nan=0.0, posinf=0.0, neginf=0.0)
        low, high = float(array.min(initial=0.0)), float(array.max(initial=0.0))
        if low >= 0.0 and high <= 1.0:
            scaled = array * np.float32(255.0)
        elif low >= 0.0 and high <= 255.0:
            scaled = array
        else:
            scaled = (array - np.float32(low)) * np.float32(255.0 / max(high - low, 1e-12))
        return Image.fromarray(np.clip(scaled, 0, 255, out=scaled).astype(np.uint8), "L")
    low, high = int(array.min(initial=0)), int(array.max(initial=0))
    if low >= 0 and high <= 255:
        return Image.fromarray(array.astype(np.uint8), "L")
    if low >= 0 and high <= 65535:  # 16-bit samples in a 32-bit image
        return Image.fromarray((array >> 8).astype(np.uint8), "L")
    span = np.float32(255.0 / max(high - low, 1))
    return Image.fromarray(((array - low).astype(np.float32) * span).astype(np.uint8), "L")


# -- size ------------------------------------------------------------------------------
def output_size(width: int, height: int, size: int) -> tuple[int, int]:
    """The output dimensions for an input of ``width`` x ``height`` (see the module doc)."""
    scale = min(1.0, size / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def fit(image: Image.Image, size: int, square: bool = False,
        source_size: tuple[int, int] | None = None) -> Image.Image:
    """Crop the centre square if ``square``, then downscale so the long side is <= ``size``.

    ``source_size``: the file's full dimensions when ``image`` was decoded at a reduced
    scale (JPEG draft), so the output size follows the sizing rule exactly. (The rule
    is symmetric in width and height, so a later 90-degree turn does not change it.)
    """
    full_width, full_height = source_size or image.size
    if square:
        width, height = image.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        image = image.crop((left, top, left + side, top + side))
        full_width = full_height = min(full_width, full_height)
    target = output_size(full_width, full_height, size)
    if target != image.size:
        image = image.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return image

