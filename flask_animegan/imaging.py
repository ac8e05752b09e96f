"""The image pipeline around the network: tensors in and out, and encoding the result.

Decoding an upload lives in :mod:`flask_animegan.decoding` (it also runs in helper
processes that must not import torch); its names are re-exported here.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from .decoding import ACCEPTED_FORMATS, DecodeLimits, fit, output_size, to_rgb
from .decoding import decode_upload as _decode

__all__ = ["ACCEPTED_FORMATS", "MIME_TYPES", "decode_upload", "encode", "fit", "output_size",
           "to_image", "to_rgb", "to_tensor"]

MIME_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


def decode_upload(data: bytes, *, max_pixels: int, size: int, square: bool = False,
                  limits: DecodeLimits | None = None) -> Image.Image:
    """Decode an upload in this thread (see :func:`flask_animegan.decoding.decode_upload`).

    The server decodes through :class:`flask_animegan.decoders.Decoder` instead, which
    adds the concurrency gate and the helper process.
    """
    limits = limits or DecodeLimits(max_pixels=max_pixels)
    return _decode(data, limits, size=size, square=square)


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
