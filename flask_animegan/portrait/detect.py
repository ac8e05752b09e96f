"""Finding faces: OpenCV's frontal Haar cascade on copies turned by each of ``ROLLS``,
duplicates merged, eyes by its eye cascade (docs/portrait.md says why this detector)."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
from PIL import Image

from .face import MAX_FACES, Face

#: The long side of the copy the search runs on.
DETECT_SIDE = 1280
#: The turns searched, in degrees (with the cascade's tolerance: about +-25 degrees).
ROLLS = (0.0, -10.0, 10.0, -20.0, 20.0)
#: The smallest face the cascade can see, in px of the searched copy (its window is 24 px).
CASCADE_WINDOW = 24
#: Where the eyes sit in an upright face box, used when the eye cascade finds no pair.
EYE_X = (0.30, 0.70)
EYE_Y = 0.38
#: A face's least skin-coloured share of its centre.
SKIN_SHARE = 0.4
#: The turns that must see a face whose eyes were not found.
SEEN_TURNS = 3
#: The cascade's step between window sizes.
SCALE_STEP = 1.15


@cache
def _cascades() -> tuple[Any, Any, Any, Any]:
    import cv2

    folder: str = cv2.data.haarcascades  # type: ignore[attr-defined]  # not in the stubs
    face, eyes, second, glasses = (
        cv2.CascadeClassifier(f"{folder}haarcascade_{name}.xml")
        for name in ("frontalface_default", "eye", "frontalface_alt2", "eye_tree_eyeglasses"))
    if face.empty() or eyes.empty() or second.empty() or glasses.empty():
        raise RuntimeError(f"OpenCV's Haar cascades are missing from {folder}: "
                           "install opencv-python-headless 4.x (5.x no longer ships them)")
    return face, eyes, second, glasses


def _turned(gray: np.ndarray, degrees: float) -> tuple[np.ndarray, np.ndarray]:
    """``gray`` turned by ``degrees`` on a canvas that holds it, and the matrix back."""
    import cv2

    height, width = gray.shape
    if degrees == 0:
        return gray, np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    forward = cv2.getRotationMatrix2D((width / 2, height / 2), degrees, 1.0)
    cos, sin = abs(forward[0, 0]), abs(forward[0, 1])
    new_w, new_h = int(height * sin + width * cos), int(height * cos + width * sin)
    forward[0, 2] += new_w / 2 - width / 2
    forward[1, 2] += new_h / 2 - height / 2
    turned = cv2.warpAffine(gray, forward, (new_w, new_h), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REPLICATE)
    back = cv2.invertAffineTransform(forward)
    return turned, back


def _eyes(upright: np.ndarray, x: int, y: int, side: int) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The pupils of the face at ``x, y, side``: a level pair in its upper part, or None."""
    import cv2

    top = upright[y + side // 6: y + side * 3 // 5, x: x + side]
    if top.size == 0:
        return None
    scale = 240 / side  # the eye cascade's window is 20 px: give it eyes of about 40 px
    top = cv2.resize(top, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR)
    for cascade in (_cascades()[1], _cascades()[3]):  # bare eyes, then eyes behind glasses
        pair = _pair(cascade.detectMultiScale(top, scaleFactor=1.1, minNeighbors=4, minSize=(24, 24),
                                              maxSize=(120, 120)), scale, x, y, side)
        if pair is not None:
            return pair
    return None


def _pair(found: Any, scale: float, x: int, y: int, side: int) -> tuple[tuple[float, float], tuple[float, float]] | None:
    centres = [((ex + ew / 2) / scale + x, (ey + eh / 2) / scale + y + side // 6, ew / scale)
               for ex, ey, ew, eh in found]
    left = [c for c in centres if c[0] < x + side * 0.5]
    right = [c for c in centres if c[0] >= x + side * 0.5]
    best = None
    for lx, ly, _ in left:
        for rx, ry, _ in right:
            distance = math.hypot(rx - lx, ry - ly)
            if not 0.25 * side <= distance <= 0.6 * side or abs(ry - ly) > 0.25 * distance:
                continue
            # closest to where the eyes of an average face sit
            error = (abs(lx - (x + EYE_X[0] * side)) + abs(rx - (x + EYE_X[1] * side))
                     + abs(ly - (y + EYE_Y * side)) + abs(ry - (y + EYE_Y * side)))
            if best is None or error < best[0]:
                best = (error, (lx, ly), (rx, ry))
    return None if best is None else (best[1], best[2])


def _confirmed(upright: np.ndarray, x: int, y: int, side: int) -> bool:
    """Whether the second cascade also sees this face: the two seldom err alike."""
    pad = side // 3
    height, width = upright.shape
    region = upright[max(0, y - pad): min(height, y + side + pad), max(0, x - pad): min(width, x + side + pad)]
    found = _cascades()[2].detectMultiScale(region, scaleFactor=1.08, minNeighbors=2,
                                           minSize=(int(side * 0.7), int(side * 0.7)),
                                           maxSize=(int(side * 1.4) + 1, int(side * 1.4) + 1))
    return len(found) > 0


def _skin_share(rgb: np.ndarray) -> float:
    """The share of skin-coloured pixels (a wide YCrCb range) in an RGB patch."""
    import cv2

    ycrcb = cv2.cvtColor(rgb, cv2.COLOR_RGB2YCrCb)
    cr, cb = ycrcb[..., 1].astype(np.int16), ycrcb[..., 2].astype(np.int16)
    return float(((cr >= 135) & (cr <= 180) & (cb >= 80) & (cb <= 130)).mean())


def _inside(cx: float, cy: float, side: float, shape: tuple[int, ...]) -> bool:
    """Whether a face box lies within the picture: one over the edge is a mistake."""
    height, width = shape[:2]
    margin = side / 2
    return margin <= cx <= width - margin and margin <= cy <= height - margin


def _apply(matrix: np.ndarray, point: tuple[float, float]) -> tuple[float, float]:
    return (float(matrix[0, 0] * point[0] + matrix[0, 1] * point[1] + matrix[0, 2]),
            float(matrix[1, 0] * point[0] + matrix[1, 1] * point[1] + matrix[1, 2]))


def find_faces(image: Image.Image, *, min_size: int, max_faces: int = MAX_FACES) -> list[Face]:
    """Faces of at least ``min_size`` px in ``image``, strongest first, at most ``max_faces``."""
    import cv2

    width, height = image.size
    scale = min(1.0, DETECT_SIDE / max(width, height, 1))
    smallest = max(CASCADE_WINDOW, math.floor(min_size * scale))
    if min(width, height) * scale < smallest:
        return []
    gray = np.asarray(image.convert("L"))
    if scale < 1.0:
        gray = cv2.resize(gray, (max(1, round(width * scale)), max(1, round(height * scale))),
                          interpolation=cv2.INTER_AREA)
    # local contrast, not a global equalisation: a face on a dark scene keeps its own contrast
    gray = cv2.createCLAHE(clipLimit=2.0, tileGridSize=(8, 8)).apply(gray)
    rgb = np.asarray(image.convert("RGB"))
    # a grey (or nearly grey) photo has no skin colour to check
    coloured = float(np.asarray(image.convert("HSV"))[..., 1].mean()) > 20
    face_cascade = _cascades()[0]
    candidates: list[tuple[float, float, float, float, float, np.ndarray, np.ndarray, tuple[int, int, int]]] = []
    for roll in ROLLS:
        turned, back = _turned(gray, -roll)  # turning the picture back by the roll makes the face upright
        boxes, _levels, weights = face_cascade.detectMultiScale3(
            turned, scaleFactor=SCALE_STEP, minNeighbors=5, minSize=(smallest, smallest), outputRejectLevels=True)
        for (x, y, w, _h), weight in zip(boxes, weights, strict=True):
            cx, cy = _apply(back, (x + w / 2, y + w / 2))
            candidates.append((float(weight), cx, cy, float(w), roll, turned, back, (int(x), int(y), int(w))))
    candidates.sort(key=lambda c: -c[0])
    kept: list[tuple[float, float, float, float, float, np.ndarray, np.ndarray, tuple[int, int, int]]] = []
    rolls: list[set[float]] = []  # the turns each kept face was seen in
    for candidate in candidates:
        _, cx, cy, side = candidate[:4]
        near = [i for i, k in enumerate(kept) if math.hypot(cx - k[1], cy - k[2]) <= 0.5 * max(side, k[3])]
        if near:
            rolls[near[0]].add(candidate[4])
        else:
            kept.append(candidate)
            rolls.append({candidate[4]})
    faces = []
    for (weight, cx, cy, side, roll, turned, back, (x, y, w)), seen in zip(kept, rolls, strict=True):
        if side / scale < min_size or not _inside(cx, cy, side, gray.shape):
            continue
        eyes = _eyes(turned, x, y, w)
        found = eyes is not None
        # a face: both cascades agree, and the eyes are found or more than one turn saw it
        if not _confirmed(turned, x, y, w) or not (found or len(seen) >= SEEN_TURNS):
            continue
        if coloured:
            half = side / scale / 4
            px, py = cx / scale, cy / scale
            centre = rgb[max(0, round(py - half)): round(py + half), max(0, round(px - half)): round(px + half)]
            if centre.size == 0 or _skin_share(centre) < SKIN_SHARE:
                continue
        if eyes is None:
            eyes = ((x + EYE_X[0] * w, y + EYE_Y * w), (x + EYE_X[1] * w, y + EYE_Y * w))
        left, right = (_apply(back, eye) for eye in eyes)
        # the roll is the eye line's slope (y grows downwards)
        angle = math.degrees(math.atan2(left[1] - right[1], right[0] - left[0]))
        left, right = (left[0] / scale, left[1] / scale), (right[0] / scale, right[1] / scale)
        full = side / scale
        box = (round(cx / scale - full / 2), round(cy / scale - full / 2), round(full), round(full))
        faces.append(Face(box, left, right, angle if found else roll, weight + (1.0 if found else 0.0), found))
    faces.sort(key=lambda f: -f.score)
    return faces[:max_faces]
