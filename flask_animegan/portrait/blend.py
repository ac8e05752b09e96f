"""Pasting converted faces back: each warped from its crop into the picture, feathered
by an elliptic raised-cosine mask, so the two styles meet over a band, not a line."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
from PIL import Image

from .align import align_face, crop_matrix
from .face import Face

#: The feather's ellipse in the crop, as fractions of its side: centre and radii.
CENTRE = (0.5, 0.53)
RADII = (0.30, 0.37)
#: The share of the radii that is fully the converted face; the rest is the ramp.
INNER = 0.65


@cache
def feather(crop_size: int) -> np.ndarray:
    """The feather mask in a ``crop_size`` crop: float32 in [0, 1]."""
    coords = (np.arange(crop_size, dtype=np.float32) + 0.5) / crop_size
    dx = (coords[None, :] - CENTRE[0]) / RADII[0]
    dy = (coords[:, None] - CENTRE[1]) / RADII[1]
    radius = np.sqrt(dx * dx + dy * dy)
    ramp = np.clip((1.0 - radius) / (1.0 - INNER), 0.0, 1.0)
    mask: np.ndarray = (0.5 - 0.5 * np.cos(np.pi * ramp)).astype(np.float32)
    return mask


def face_crops(picture: Image.Image, faces: list[Face], convert_face: Callable[[Image.Image], Image.Image],
               crop_size: int = 512) -> list[Image.Image]:
    """Each face aligned into a ``crop_size`` square and converted by ``convert_face``."""
    crops = [convert_face(align_face(picture, face, crop_size)).convert("RGB") for face in faces]
    return [crop if crop.size == (crop_size, crop_size)
            else crop.resize((crop_size, crop_size), Image.Resampling.BICUBIC) for crop in crops]


def _paste(result: np.ndarray, face: Face, crop: Image.Image, crop_size: int) -> None:
    """Warp ``crop`` and the feather back onto ``face`` in ``result`` (float32, H x W x 3)."""
    height, width = result.shape[:2]
    to_picture = crop_matrix(face, crop_size)
    corners = to_picture @ np.array([[0, crop_size, 0, crop_size], [0, 0, crop_size, crop_size], [1, 1, 1, 1]])
    left, top = max(0, int(np.floor(corners[0].min()))), max(0, int(np.floor(corners[1].min())))
    right, bottom = min(width, int(np.ceil(corners[0].max()))), min(height, int(np.ceil(corners[1].max())))
    if right <= left or bottom <= top:
        return
    # the region's pixel -> the crop's pixel
    to_crop = np.linalg.inv(to_picture) @ np.array([[1.0, 0, left], [0, 1.0, top], [0, 0, 1.0]])
    coefficients = tuple(float(v) for v in to_crop[:2].reshape(-1))
    size = (right - left, bottom - top)
    face_pixels = np.asarray(crop.transform(size, Image.Transform.AFFINE, coefficients,
                                            resample=Image.Resampling.BICUBIC), dtype=np.float32)
    mask_image = Image.fromarray(feather(crop_size), mode="F")
    mask = np.asarray(mask_image.transform(size, Image.Transform.AFFINE, coefficients,
                                           resample=Image.Resampling.BILINEAR), dtype=np.float32)[..., None]
    region = result[top:bottom, left:right]
    region += mask * (face_pixels - region)


def paste_faces(picture: Image.Image, faces: list[Face], scene: Image.Image,
                convert_face: Callable[[Image.Image], Image.Image], crop_size: int = 512) -> Image.Image:
    """``scene`` with each face of ``picture`` converted in its aligned crop and pasted back."""
    scene = scene.convert("RGB")
    if scene.size != picture.size:
        scene = scene.resize(picture.size, Image.Resampling.BICUBIC)
    if not faces:
        return scene
    result = np.asarray(scene, dtype=np.float32).copy()
    for face, crop in zip(faces, face_crops(picture, faces, convert_face, crop_size), strict=True):
        _paste(result, face, crop, crop_size)
    return Image.fromarray(np.clip(np.rint(result), 0, 255).astype(np.uint8), "RGB")


def seam_ratio(output: Image.Image, face: Face, crop_size: int = 512) -> float:
    """Luma gradient energy along the feather band over the face's interior: about 1
    without a seam, higher where a line shows."""
    crop = np.asarray(align_face(output, face, crop_size).convert("L"), dtype=np.float32)
    gy, gx = np.gradient(crop)
    energy = gx * gx + gy * gy
    mask = feather(crop_size)
    band = (mask > 0.0) & (mask < 1.0)
    interior = mask >= 1.0
    return float(energy[band].mean() / max(float(energy[interior].mean()), 1e-6))
