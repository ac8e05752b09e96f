"""A generated corpus of group photos with faces at known boxes (portrait mode's acceptance).

Nothing is downloaded: the faces are cut from photos that ship in wheels (scikit-image's
``astronaut``, matplotlib's ``grace_hopper.jpg``, each also mirrored), pasted with a feathered
head-and-shoulders mask into scene photos that ship in wheels, 48-400 px, rolled up to +-20
degrees, 1-5 to a picture, never overlapping. The face-free photos (``china``, ``coffee``,
``rocket``, ``chelsea``) are for counting false faces.

**The box.** A face's known box is the box OpenCV's frontal Haar cascade draws around the
upright source face (brow to chin, ear to ear; measured once on each source, ``SOURCES``),
carried through the paste: scaled with the face and centred where the face's centre lands,
in the face's own upright frame (for a rolled face, the square rolled with it, reported by
its centre and side; never the axis-aligned hull of the rolled square).
``flask_animegan.portrait.find_faces`` reports boxes the same way, so IoU compares the two
squares as if both were upright about their centres.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

#: Canvas of a corpus picture (the detector sees it whole: 1280 px is under its working side).
CANVAS = (1280, 960)
#: The region cut around a source face, as a multiple of its box side (head and some hair).
CONTEXT = 1.8


@dataclass(frozen=True)
class SourceFace:
    name: str
    box: tuple[int, int, int, int]  # x, y, side, side: the frontal Haar cascade's box, upright
    left_eye: tuple[float, float]  # the eye on the picture's left, pupil centre
    right_eye: tuple[float, float]


#: Measured once: the box is the mean of the default and alt2 cascades' boxes on the upright
#: source; the pupils were read off a 4x enlargement.
SOURCES = (
    SourceFace("astronaut", (177, 66, 96, 96), (204.0, 101.0), (246.0, 104.0)),
    SourceFace("grace_hopper", (150, 102, 230, 230), (222.0, 190.0), (307.0, 186.0)),
)


@dataclass(frozen=True)
class PlacedFace:
    """A face pasted into a corpus picture: its known box (see the module's docstring) and roll."""

    centre: tuple[float, float]
    side: float
    angle: float  # roll in degrees, counter-clockwise as seen
    source: str

    @property
    def box(self) -> tuple[float, float, float, float]:
        x, y = self.centre
        return (x - self.side / 2, y - self.side / 2, self.side, self.side)


@dataclass(frozen=True)
class CorpusPicture:
    image: Image.Image
    faces: tuple[PlacedFace, ...]
    scene: str


@cache
def source_image(name: str) -> Image.Image:
    if name == "astronaut":
        from skimage import data

        return Image.fromarray(data.astronaut()).convert("RGB")
    import matplotlib.cbook

    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as handle:
        return Image.open(handle).convert("RGB")


def face_free_photos() -> dict[str, Image.Image]:
    """The four photos without faces that false faces are counted on."""
    from skimage import data
    from sklearn.datasets import load_sample_image

    return {
        "china": Image.fromarray(load_sample_image("china.jpg")),
        "coffee": Image.fromarray(data.coffee()),
        "rocket": Image.fromarray(data.rocket()),
        "chelsea": Image.fromarray(data.chelsea()),
    }


def scene_photos() -> dict[str, Image.Image]:
    """Backgrounds for the corpus: photos without faces, from scikit-image and scikit-learn."""
    from skimage import data
    from sklearn.datasets import load_sample_image

    scenes = dict(face_free_photos())
    scenes["flower"] = Image.fromarray(load_sample_image("flower.jpg"))
    scenes["hubble"] = Image.fromarray(data.hubble_deep_field())
    scenes["gravel"] = Image.fromarray(data.gravel()).convert("RGB")
    return scenes


def _cut(source: SourceFace, mirror: bool) -> tuple[Image.Image, float]:
    """The source face's region with a feathered head mask as alpha, and its box side."""
    x, y, side, _ = source.box
    cx, cy = x + side / 2, y + side / 2
    half = CONTEXT * side / 2
    region = source_image(source.name).crop(
        (round(cx - half), round(cy - half), round(cx + half), round(cy + half)))
    size = region.size[0]
    mask = Image.new("L", region.size, 0)
    # an ellipse a little taller than wide, about the face box: head, hair and chin
    rx, ry = 0.40 * size, 0.47 * size
    ImageDraw.Draw(mask).ellipse((size / 2 - rx, size / 2 - ry * 1.02, size / 2 + rx, size / 2 + ry), fill=255)
    mask = mask.filter(ImageFilter.GaussianBlur(size * 0.03))
    region.putalpha(mask)
    if mirror:
        region = region.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return region, float(side)


def _fits(centre: tuple[float, float], reach: float, taken: list[tuple[float, float, float]]) -> bool:
    width, height = CANVAS
    if not (reach <= centre[0] <= width - reach and reach <= centre[1] <= height - reach):
        return False
    return all(math.dist(centre, (x, y)) > reach + other for x, y, other in taken)


def make_picture(rng: random.Random, index: int) -> CorpusPicture:
    """One corpus picture: a scene, then 1-5 faces, the largest placed first."""
    scenes = scene_photos()
    scene_name = sorted(scenes)[index % len(scenes)]
    canvas = scenes[scene_name].convert("RGB").resize(CANVAS, Image.Resampling.BICUBIC)
    count = rng.randint(1, 5)
    # log-uniform sizes over 48-400 px
    sides = sorted((math.exp(rng.uniform(math.log(48), math.log(400))) for _ in range(count)), reverse=True)
    taken: list[tuple[float, float, float]] = []
    faces = []
    for side in sides:
        source = rng.choice(SOURCES)
        mirror = rng.random() < 0.5
        angle = rng.uniform(-20.0, 20.0)
        reach = side * CONTEXT / 2 * 1.1
        for _ in range(200):
            centre = (rng.uniform(reach, CANVAS[0] - reach), rng.uniform(reach, CANVAS[1] - reach))
            if _fits(centre, reach, taken):
                break
        else:
            continue  # no room left for a face this size: the picture has fewer
        region, source_side = _cut(source, mirror)
        scale = side / source_side
        size = max(1, round(region.size[0] * scale))
        region = region.resize((size, size), Image.Resampling.LANCZOS)
        region = region.rotate(angle, resample=Image.Resampling.BICUBIC, expand=True)
        canvas.paste(region, (round(centre[0] - region.size[0] / 2), round(centre[1] - region.size[1] / 2)), region)
        taken.append((centre[0], centre[1], reach))
        faces.append(PlacedFace(centre, side, angle, source.name + ("-mirrored" if mirror else "")))
    return CorpusPicture(canvas, tuple(faces), scene_name)


def corpus(count: int = 24, seed: int = 28) -> list[CorpusPicture]:
    rng = random.Random(seed)
    return [make_picture(rng, index) for index in range(count)]


def upright_iou(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    """IoU of two boxes given as x, y, width, height (both upright about their centres)."""
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    w = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    h = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = w * h
    return inter / (aw * ah + bw * bh - inter)


def score(pictures: list[CorpusPicture], found: list[list[tuple[float, float, float, float]]],
          min_side: float = 80.0, threshold: float = 0.6) -> dict[str, float]:
    """Recall of the known faces of ``min_side`` px or more at IoU >= ``threshold``, the mean
    IoU of those matched, and false faces (found boxes matching no known face) per picture."""
    known = matched = false = 0
    ious = []
    for picture, boxes in zip(pictures, found, strict=True):
        used: set[int] = set()
        for face in picture.faces:
            best, best_iou = -1, 0.0
            for i, box in enumerate(boxes):
                iou = upright_iou(face.box, box)
                if i not in used and iou > best_iou:
                    best, best_iou = i, iou
            if best_iou >= threshold:
                used.add(best)
            if face.side >= min_side:
                known += 1
                if best_iou >= threshold:
                    matched += 1
                    ious.append(best_iou)
        # a found box over a known face too small to count is not a false face
        false += sum(1 for i, box in enumerate(boxes) if i not in used
                     and max((upright_iou(f.box, box) for f in picture.faces), default=0.0) < 0.3)
    return {"faces": known, "recall": matched / max(1, known),
            "mean_iou": float(np.mean(ious)) if ious else 0.0,
            "false_per_picture": false / max(1, len(pictures))}
