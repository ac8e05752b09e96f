"""Aligning a face by its eyes into the FFHQ-style square crop the face styles learnt on
(eyes level, side four eye distances); the mouth is placed where an average face has it."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from .face import Face

#: The crop's side, in eye distances (FFHQ: max(2.0 x eye distance, 1.8 x eye-to-mouth) x 2).
CROP_EYE_DISTANCES = 4.0
#: The crop's centre below the eyes' midpoint, in eye distances (FFHQ: 0.1 x eye-to-mouth).
CENTRE_BELOW_EYES = 0.1


def crop_matrix(face: Face, crop_size: int) -> np.ndarray:
    """The 3x3 matrix from the face's crop (``crop_size`` px square) to the picture's pixels."""
    (lx, ly), (rx, ry) = face.left_eye, face.right_eye
    distance = max(math.hypot(rx - lx, ry - ly), 1.0)
    angle = math.atan2(ry - ly, rx - lx)  # the eye line in picture coordinates (y down)
    cos, sin = math.cos(angle), math.sin(angle)
    # "down" in the face's frame, perpendicular to the eye line
    down = (-sin, cos)
    cx = (lx + rx) / 2 + CENTRE_BELOW_EYES * distance * down[0]
    cy = (ly + ry) / 2 + CENTRE_BELOW_EYES * distance * down[1]
    scale = CROP_EYE_DISTANCES * distance / crop_size
    half = crop_size / 2
    return np.array([
        [scale * cos, -scale * sin, cx - scale * (cos * half - sin * half)],
        [scale * sin, scale * cos, cy - scale * (sin * half + cos * half)],
        [0.0, 0.0, 1.0],
    ])


def align_face(picture: Image.Image, face: Face, crop_size: int = 512) -> Image.Image:
    """The face cut into a ``crop_size`` square, eyes level (black beyond the picture)."""
    matrix = crop_matrix(face, crop_size)
    coefficients = tuple(float(v) for v in matrix[:2].reshape(-1))
    return picture.convert("RGB").transform(
        (crop_size, crop_size), Image.Transform.AFFINE, coefficients, resample=Image.Resampling.BICUBIC)
