"""What still results are written as, and their MIME types (what uploads may be:
``ACCEPTED_FORMATS`` in inputs/decoding.py)."""

from __future__ import annotations

import io

from PIL import Image, PngImagePlugin

from ..config import OUTPUT_FORMATS
from .labels import ContentLabel, jpeg_with_xmp

__all__ = ["MIME_TYPES", "OUTPUT_FORMATS", "encode"]

MIME_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


def encode(image: Image.Image, fmt: str, quality: int = 90,
           label: ContentLabel | None = None) -> bytes:
    """Encode to ``fmt`` (jpeg, png, webp), with ``label`` as XMP. The image is fresh and
    no metadata is passed but the label's, so none of the upload's (EXIF, GPS) survives."""
    buffer = io.BytesIO()
    xmp = label.xmp() if label is not None else None
    if fmt == "jpeg":
        # Pillow would copy a comment and an ICC profile left in ``image.info``: none here
        image.save(buffer, "JPEG", quality=quality, comment=b"", icc_profile=None)
        return jpeg_with_xmp(buffer.getvalue(), xmp) if xmp else buffer.getvalue()
    if fmt == "webp":
        image.save(buffer, "WEBP", quality=quality, method=4, **({"xmp": xmp} if xmp else {}))
    elif fmt == "png":
        info = None
        if xmp:
            info = PngImagePlugin.PngInfo()
            info.add_itxt("XML:com.adobe.xmp", xmp.decode())
        image.save(buffer, "PNG", compress_level=3, pnginfo=info, icc_profile=None)
    else:
        raise ValueError(f"unknown output format {fmt!r}")
    return buffer.getvalue()
