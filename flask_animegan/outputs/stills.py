"""What still results are written as, and their MIME types (what uploads may be:
``ACCEPTED_FORMATS`` in inputs/decoding.py)."""

from __future__ import annotations

import io

from PIL import Image

from ..config import OUTPUT_FORMATS

__all__ = ["MIME_TYPES", "OUTPUT_FORMATS", "encode"]

MIME_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


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
