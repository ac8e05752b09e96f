"""What every section measures with: the test photo and the style weights."""

from __future__ import annotations

import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import skimage.data
import torch
from PIL import Image

from flask_animegan.runtime.generator import Generator
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR

REPO = Path(__file__).resolve().parent.parent
SHIPPED_STYLE = SHIPPED_STYLES_DIR / "toon_demo.pt"
PHOTO_SIZE = (1080, 1350)  # a 4:5 portrait, the articles' selfie
PHOTO_QUALITY = 90


@dataclass(frozen=True)
class Weights:
    """A models folder holding exactly one style, and where its weights came from."""

    models_dir: Path
    style: str
    path: Path
    source: str


def prepare_weights(folder: Path) -> Weights:
    """Put the one style (shipped ``toon_demo``, else seeded random weights) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    if SHIPPED_STYLE.is_file():
        path = folder / SHIPPED_STYLE.name
        shutil.copyfile(SHIPPED_STYLE, path)
        return Weights(folder, "toon_demo", path, "the shipped toon_demo style")
    torch.manual_seed(0)
    path = folder / "bench_style.pt"
    torch.save(Generator().state_dict(), path)
    return Weights(folder, "bench_style", path,
                   "random Generator() weights, torch.manual_seed(0) (toon_demo.pt absent)")


def photo() -> Image.Image:
    """The 1080x1350 test photo: scikit-image's astronaut centre-cropped to 4:5, LANCZOS-resized."""
    image = Image.fromarray(np.asarray(skimage.data.astronaut())).convert("RGB")
    width, height = image.size
    crop_w = round(height * PHOTO_SIZE[0] / PHOTO_SIZE[1])
    left = (width - crop_w) // 2
    image = image.crop((left, 0, left + crop_w, height))
    return image.resize(PHOTO_SIZE, Image.Resampling.LANCZOS)


def jpeg(image: Image.Image, quality: int = PHOTO_QUALITY) -> bytes:
    """``image`` as JPEG bytes, the way a phone or browser would upload it."""
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


PHOTO_DESCRIPTION = (f"skimage.data.astronaut() centre-cropped to 4:5, LANCZOS-resized to "
                     f"{PHOTO_SIZE[0]}x{PHOTO_SIZE[1]}, JPEG q{PHOTO_QUALITY}")
