"""The image pipeline around the network: decode an upload, fit it, tensors, encode.

Sizing rule (documented in the README): the output keeps the input's aspect ratio;
its long side is ``min(input long side, size)``; each side is rounded to the nearest
pixel and is at least 1. Face styles first crop the centre square (as upstream's
``face2paint``), so their output is ``min(short side, size)`` square. Images are
never upscaled.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image, ImageCms, ImageOps, UnidentifiedImageError

from .errors import BadImage, ImageTooLarge, UnsupportedImage

#: Formats accepted from uploads, decided by content (Pillow's signature checks).
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
MIME_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
_SRGB = ImageCms.createProfile("sRGB")
_ACCEPTED_HINT = "send a JPEG, PNG, WebP, GIF, BMP or TIFF image"

# Uploads are untrusted: Pillow's own advice is to make its bomb warning an error.
warnings.simplefilter("error", Image.DecompressionBombWarning)


def decode_upload(data: bytes, *, max_pixels: int, size: int, square: bool = False) -> Image.Image:
    """Decode an uploaded file into an upright RGB image, at reduced scale when possible.

    The dimensions in the header are checked against ``max_pixels`` before any pixel
    is decoded. JPEGs are decoded with Pillow's ``draft`` at the smallest DCT scale
    that still covers the output ``size`` (``square``: the centre square must cover it).
    """
    if not data:
        raise BadImage(f"the upload is empty; {_ACCEPTED_HINT}")
    try:
        image = Image.open(io.BytesIO(data), formats=ACCEPTED_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(data) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLarge(f"the image has too many pixels; the limit is {max_pixels:,}") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise BadImage("the image has no pixels")
    if width * height > max_pixels:
        raise ImageTooLarge(f"the image is {width}x{height} = {width * height:,} pixels; "
                            f"the limit is {max_pixels:,}. Send a smaller image")
    if image.format == "JPEG":
        scale = size / (min(width, height) if square else max(width, height))
        if scale < 1:
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
    try:
        image.load()  # the first frame of an animation
        image = ImageOps.exif_transpose(image)
        return to_rgb(image)
    except (ImageTooLarge, BadImage):
        raise
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for corrupt data
        raise BadImage(f"the {image.format} image is truncated or corrupt and cannot be "
                       f"decoded ({exc.__class__.__name__})") from None


def _unidentified(data: bytes) -> Exception:
    """415 for an image in a format we do not accept, 400 for anything else."""
    try:
        with Image.open(io.BytesIO(data)) as other:
            fmt = other.format
    except Exception:  # noqa: BLE001 - not an image at all
        return BadImage(f"the file is not an image this server can read; {_ACCEPTED_HINT}")
    return UnsupportedImage(f"{fmt} images are not accepted; {_ACCEPTED_HINT}")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any mode (1, L, LA, P, RGBA, CMYK, I;16, ...) to RGB in sRGB, alpha over white."""
    if image.mode.startswith("I") or image.mode == "F":
        array = np.asarray(image)
        if image.mode.startswith("I;16") or array.max(initial=0) > 255:
            array = array / 257.0  # 16-bit samples
        image = Image.fromarray(np.clip(array, 0, 255).astype(np.uint8), "L")
    icc = image.info.get("icc_profile")
    if icc and image.mode in ("RGB", "RGBA", "CMYK", "L"):
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            out_mode = "RGBA" if image.mode == "RGBA" else "RGB"
            image = ImageCms.profileToProfile(image, source, _SRGB, outputMode=out_mode)
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # an unusable profile: keep the pixels as they are
    if image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
    else:
        rgb = image.convert("RGB") if image.mode != "RGB" else image
    rgb.info = {}  # drop EXIF, GPS, comments and the (now applied) ICC profile
    return rgb


def output_size(width: int, height: int, size: int) -> tuple[int, int]:
    """The output dimensions for an input of ``width`` x ``height`` (see the module doc)."""
    scale = min(1.0, size / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def fit(image: Image.Image, size: int, square: bool = False) -> Image.Image:
    """Crop the centre square if ``square``, then downscale so the long side is <= ``size``."""
    if square:
        width, height = image.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        image = image.crop((left, top, left + side, top + side))
    target = output_size(*image.size, size)
    if target != image.size:
        image = image.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return image


def to_tensor(image: Image.Image) -> torch.Tensor:
    """RGB image -> float tensor (1, 3, H, W) in [-1, 1]."""
    array = torch.from_numpy(np.array(image, dtype=np.uint8))
    return array.permute(2, 0, 1).unsqueeze(0).float().div_(127.5).sub_(1.0)


def to_image(batch: torch.Tensor) -> Image.Image:
    """Tensor (1, 3, H, W) in [-1, 1] -> RGB image (values clamped)."""
    pixels = batch[0].float().clamp(-1.0, 1.0).add(1.0).mul(127.5).round().to(torch.uint8)
    return Image.fromarray(pixels.permute(1, 2, 0).contiguous().numpy(), "RGB")


def encode(image: Image.Image, fmt: str, quality: int = 90) -> bytes:
    """Encode to ``fmt`` (jpeg, png, webp). The image is fresh, so no input metadata survives."""
    buffer = io.BytesIO()
    if fmt == "jpeg":
        image.save(buffer, "JPEG", quality=quality)
    elif fmt == "webp":
        image.save(buffer, "WEBP", quality=quality, method=4)
    elif fmt == "png":
        image.save(buffer, "PNG", compress_level=3)
    else:
        raise ValueError(f"unknown output format {fmt!r}")
    return buffer.getvalue()
