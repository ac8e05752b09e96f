"""The recipe behind the shipped ``toon_demo`` style: its teacher filter, its photos, its figures.

Shared by ``tools/train_demo_style.py`` (which trains the generator to imitate the teacher)
and ``tests/test_toon_demo.py`` (which recomputes the model card's figures for the committed
weights). Needs scikit-image, and scikit-learn for ``china.jpg``.

The figures, on photos the student never saw:

* **edge energy**: the mean Sobel gradient magnitude of the gray image, output over input
  (a σ = 4 Gaussian blur keeps about 0.3 of it; a cartoon with contour lines keeps 1 or more);
* **saturation**: mean HSV saturation, output over input;
* **PSNR against the teacher**: how closely the student imitates the filter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from skimage import color, data, filters, metrics, restoration

REPO = Path(__file__).resolve().parent.parent

#: Photos the student never sees in training: a portrait, a still life and two busy outdoor
#: scenes (a temple above trees and a lake; a launch pad at night with towers and lights).
HELD_OUT = ("astronaut", "coffee", "sklearn:china.jpg", "rocket")
#: The long sides the figures are measured at (the app's default size, and a small one).
SIDES = (512, 256)


# -- the teacher ----------------------------------------------------------------------

#: The contour lines' σ at a long side of 512 px (it scales with the picture), and the
#: XDoG's soft threshold: where a difference of Gaussians below minus this draws ink.
LINE_SIGMA = 1.5
LINE_THRESHOLD = 0.003
#: The finished drawing is softened by a Gaussian of this σ at 512 px (scaled likewise):
#: anti-aliasing for its 1-px steps, which the student cannot place (see the model card).
SOFTEN = 0.7


def teacher(rgb: np.ndarray) -> np.ndarray:
    """Cartoon filter: float32 HxWx3 in [0, 1] -> float32 HxWx3 in [0, 1].

    * mild edge-preserving flattening (total-variation denoising, weight 0.06: it wipes
      out noise and fine texture, not structure; the first teacher's 0.3 wiped out both);
    * CIELAB lightness in bands of 10 units with steep soft steps, and chroma x 1.35;
    * dark contour lines from an XDoG (difference of Gaussians with a soft threshold) of
      the original, darkening by up to 85 %. Its σ scales with the picture's long side
      (``LINE_SIGMA`` px at 512, half that at 256), so the lines keep their place in the
      picture at any size instead of swallowing a small one;
    * a ``SOFTEN``-px Gaussian over the result, which anti-aliases the lines and band
      steps (on the held-out photos at 512 px the result keeps 0.86-1.16 of the input's
      edge energy; v3's teacher, unsoftened and with thinner lines, 1.17-1.26).
    """
    smooth = restoration.denoise_tv_chambolle(rgb, weight=0.06, channel_axis=-1)
    lab = color.rgb2lab(smooth)
    bands = lab[..., 0] / 10.0
    floor = np.floor(bands)
    lab[..., 0] = (floor + 1 / (1 + np.exp(-(bands - floor - 0.5) * 10.0))) * 10.0
    lab[..., 1:] *= 1.35
    toon = np.clip(color.lab2rgb(lab), 0, 1)
    lines = line_map(rgb)
    drawn = toon * (1 - 0.85 * lines[..., None])
    scale = max(rgb.shape[:2]) / 512
    return filters.gaussian(drawn, sigma=SOFTEN * scale, channel_axis=-1).astype(np.float32)


def line_map(rgb: np.ndarray) -> np.ndarray:
    """Where the teacher draws lines (0..1), for the loss's line weighting."""
    scale = max(rgb.shape[:2]) / 512
    gray = color.rgb2gray(rgb)
    sigma = max(0.5, LINE_SIGMA * scale)
    dog = filters.gaussian(gray, sigma=sigma) - 0.98 * filters.gaussian(gray, sigma=1.6 * sigma)
    return np.where(dog >= -LINE_THRESHOLD, 0.0,
                    -np.tanh(200.0 * (dog + LINE_THRESHOLD))).astype(np.float32)


# -- photos ---------------------------------------------------------------------------

def load_photo(name: str) -> np.ndarray:
    """A photo shipped inside a wheel, as float32 RGB in [0, 1].

    ``name`` is a ``skimage.data`` function, ``sklearn:FILE`` (scikit-learn's sample
    images) or ``matplotlib:FILE`` (matplotlib's sample data).
    """
    if ":" in name:
        package, file_name = name.split(":")
        if package == "sklearn":
            from sklearn.datasets import load_sample_image
            array = load_sample_image(file_name)
        else:
            import matplotlib
            array = np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data"
                                          / file_name).convert("RGB"))
        return np.asarray(array, np.float32) / 255
    array = getattr(data, name)()
    if isinstance(array, tuple):  # stereo pairs
        array = array[0]
    image = Image.fromarray(np.asarray(array)).convert("RGB")
    return np.asarray(image, np.float32) / 255


def fitted(name: str, side: int) -> np.ndarray:
    """The held-out photo as the app would see it at ``side`` (float32 in [0, 1])."""
    from flask_animegan import imaging

    image = Image.fromarray((load_photo(name) * 255).round().astype(np.uint8))
    return np.asarray(imaging.fit(image, side), np.float32) / 255


def short_name(name: str) -> str:
    return name.split(":")[-1].split(".")[0]


# -- figures --------------------------------------------------------------------------

def edge_energy(rgb: np.ndarray) -> float:
    """Mean Sobel gradient magnitude of the gray image."""
    return float(filters.sobel(color.rgb2gray(rgb)).mean())


def saturation(rgb: np.ndarray) -> float:
    """Mean HSV saturation."""
    return float(color.rgb2hsv(rgb)[..., 1].mean())


def stylise(model: torch.nn.Module, rgb: np.ndarray) -> np.ndarray:
    """The student's output for ``rgb`` (float32 in [0, 1]), through the app's own conversions."""
    from flask_animegan import imaging

    image = Image.fromarray((rgb * 255).round().astype(np.uint8))
    with torch.inference_mode():
        output = imaging.to_image(model(imaging.to_tensor(image)))
    return np.asarray(output, np.float32) / 255


def figures(model: torch.nn.Module, photos=HELD_OUT, sides=SIDES) -> dict:
    """Per photo and side: the student's edge energy and saturation over the input's, the
    teacher's, and the student's PSNR against the teacher; then the means per side."""
    result: dict = {}
    for side in sides:
        rows = {}
        for name in photos:
            source = fitted(name, side)
            target = (teacher(source) * 255).round() / 255
            student = stylise(model, source)
            rows[short_name(name)] = {
                "edge": round(edge_energy(student) / edge_energy(source), 3),
                "saturation": round(saturation(student) / saturation(source), 3),
                "psnr_db": round(float(metrics.peak_signal_noise_ratio(
                    target, student, data_range=1.0)), 2),
                "teacher_edge": round(edge_energy(target) / edge_energy(source), 3),
                "teacher_saturation": round(saturation(target) / saturation(source), 3),
            }
        means = {key: round(float(np.mean([row[key] for row in rows.values()])), 3)
                 for key in ("edge", "saturation", "psnr_db")}
        result[str(side)] = {"photos": rows, "mean": means}
    return result


def samples_sheet(model: torch.nn.Module, path: Path,
                  photos=("sklearn:china.jpg", "astronaut"), sides=SIDES) -> None:
    """input | teacher | student for each photo at each side, 256-px rows shown at 2x with
    nearest-neighbour pixels so that what the student does at that size is visible."""
    rows = []
    for side in sides:
        for name in photos:
            source = fitted(name, side)
            row = np.concatenate([source, teacher(source), stylise(model, source)], axis=1)
            image = Image.fromarray((np.clip(row, 0, 1) * 255).round().astype(np.uint8))
            if side < max(sides):
                factor = max(sides) // side
                image = image.resize((image.width * factor, image.height * factor),
                                     Image.Resampling.NEAREST)
            rows.append(np.asarray(image))
    width = max(r.shape[1] for r in rows)
    padded = [np.pad(r, ((0, 8), (0, width - r.shape[1]), (0, 0)), constant_values=255)
              for r in rows]
    Image.fromarray(np.concatenate(padded, 0)).save(path, quality=88)


def card_table(figures: dict) -> str:
    """The model card's table of ``figures`` (what ``tests/test_toon_demo.py`` looks for)."""
    lines = ["| photo | px | edge energy | saturation | PSNR vs teacher | teacher's edge energy "
             "| teacher's saturation |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for side, block in figures.items():
        for photo, row in block["photos"].items():
            lines.append(f"| `{photo}` | {side} | {row['edge']:.2f} | {row['saturation']:.2f} "
                         f"| {row['psnr_db']:.1f} dB | {row['teacher_edge']:.2f} "
                         f"| {row['teacher_saturation']:.2f} |")
        mean = block["mean"]
        lines.append(f"| **mean** | {side} | {mean['edge']:.2f} | {mean['saturation']:.2f} "
                     f"| {mean['psnr_db']:.1f} dB | | |")
    return "\n".join(lines)
