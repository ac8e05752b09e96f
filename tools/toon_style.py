"""The recipe behind the shipped ``toon_demo`` style: its teacher filter, photos and figures.

Used by tools/train_demo_style.py and tests/test_toon_demo.py; run it to measure your own
photos (``python tools/toon_style.py a.jpg --sheet out.jpg``). Figures: edge energy and
saturation (output over input) and PSNR against the teacher (the model card explains them).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from skimage import color, data, filters, metrics, restoration

REPO = Path(__file__).resolve().parent.parent

#: Photos the student never sees in training.
HELD_OUT = ("astronaut", "coffee", "sklearn:china.jpg", "rocket")
#: The long sides the figures are measured at (the app's default size, and a small one).
SIDES = (512, 256)


# -- the teacher ----------------------------------------------------------------------

#: The contour lines' σ at 512 px (scaled with the picture) and the XDoG's ink threshold.
LINE_SIGMA = 1.5
LINE_THRESHOLD = 0.003
#: σ of the final softening at 512 px: anti-aliasing the student cannot place itself.
SOFTEN = 0.7
#: CIELAB chroma is multiplied by this.
CHROMA = 1.45
#: Every photo's RMS distance from mid-gray (in [-1, 1]) before the filter.
CONTRAST = 0.6


def normalise_contrast(rgb: np.ndarray) -> np.ndarray:
    """``rgb`` scaled about mid-gray to an RMS distance of ``CONTRAST``: the generator
    cannot see contrast, so neither must the teacher."""
    centred = rgb * 2 - 1
    spread = float(np.sqrt(np.mean(centred ** 2)))
    if spread < 1e-6:  # a mid-gray picture
        return rgb
    return np.clip((centred * (CONTRAST / spread) + 1) / 2, 0, 1).astype(np.float32)


def teacher(rgb: np.ndarray) -> np.ndarray:
    """Cartoon filter, float32 HxWx3 in [0, 1] both ways: one contrast, total-variation
    flattening, CIELAB lightness bands and chroma, XDoG contour lines scaled with the
    picture, then a soft Gaussian (the model card gives the recipe's figures)."""
    return teacher_and_lines(rgb)[0]


def teacher_and_lines(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``teacher(rgb)`` and where it drew lines (0..1), which the training loss weights."""
    rgb = normalise_contrast(rgb)
    lines = xdog_lines(rgb)
    smooth = restoration.denoise_tv_chambolle(rgb, weight=0.06, channel_axis=-1)
    lab = color.rgb2lab(smooth)
    bands = lab[..., 0] / 10.0
    floor = np.floor(bands)
    lab[..., 0] = (floor + 1 / (1 + np.exp(-(bands - floor - 0.5) * 10.0))) * 10.0
    lab[..., 1:] *= CHROMA
    toon = np.clip(color.lab2rgb(lab), 0, 1)
    drawn = toon * (1 - 0.85 * lines[..., None])
    scale = max(rgb.shape[:2]) / 512
    finished = filters.gaussian(drawn, sigma=SOFTEN * max(1.0, scale), channel_axis=-1)
    return finished.astype(np.float32), lines


def xdog_lines(rgb: np.ndarray) -> np.ndarray:
    """The XDoG's line strength (0..1) of a photo already set to the teacher's contrast."""
    scale = max(rgb.shape[:2]) / 512
    gray = color.rgb2gray(rgb)
    sigma = max(0.5, LINE_SIGMA * scale)
    dog = filters.gaussian(gray, sigma=sigma) - 0.98 * filters.gaussian(gray, sigma=1.6 * sigma)
    return np.where(dog >= -LINE_THRESHOLD, 0.0,
                    -np.tanh(200.0 * (dog + LINE_THRESHOLD))).astype(np.float32)


# -- photos ---------------------------------------------------------------------------

#: Outdoor colour photos, which the installed wheels lack, from older wheels on PyPI:
#: ``wheel:NAME`` -> (requirement, file in the wheel). Fetched once into ``build/wheels``
#: with ``pip download --no-deps`` (training only; the figures never need them).
WHEEL_PHOTOS = {
    "quokka": ("imgaug==0.4.0", "imgaug/quokka.jpg"),  # an animal on a path, foliage
    "raccoon": ("scipy==1.9.3", "scipy/misc/face.dat"),  # scipy.misc.face(): bark, leaves
}
WHEELS = REPO / "build" / "wheels"


def wheel_photo(key: str) -> np.ndarray:
    """``WHEEL_PHOTOS[key]`` as uint8 RGB, its wheel downloaded the first time."""
    import bz2
    import subprocess
    import sys
    import zipfile

    requirement, member = WHEEL_PHOTOS[key]
    project, version = requirement.split("==")
    pattern = f"{project}-{version}-*.whl"
    if not list(WHEELS.glob(pattern)):
        # the same file on any machine, whatever its own Python or platform
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", "--python-version", "3.11", "--implementation", "cp", "--abi",
                        "cp311", "--platform", "manylinux2014_x86_64", "--dest", str(WHEELS),
                        requirement], check=True)
    with zipfile.ZipFile(sorted(WHEELS.glob(pattern))[0]) as wheel:
        raw = wheel.read(member)
    if member.endswith(".dat"):  # scipy.misc.face: bz2 of raw 768 x 1024 RGB bytes
        return np.frombuffer(bz2.decompress(raw), np.uint8).reshape(768, 1024, 3)
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


def load_photo(name: str) -> np.ndarray:
    """A photo as float32 RGB in [0, 1]: a ``skimage.data`` name, ``sklearn:FILE``,
    ``matplotlib:FILE``, ``wheel:KEY`` or an image file's path."""
    if Path(name).is_file():
        with Image.open(name) as image:
            return np.asarray(image.convert("RGB"), np.float32) / 255
    if ":" in name:
        package, file_name = name.split(":")
        if package == "wheel":
            return wheel_photo(file_name).astype(np.float32) / 255
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
    from flask_animegan.inputs import decoding

    image = Image.fromarray((load_photo(name) * 255).round().astype(np.uint8))
    return np.asarray(decoding.fit(image, side), np.float32) / 255


def short_name(name: str) -> str:
    return Path(name.split(":")[-1]).stem


# -- figures --------------------------------------------------------------------------

def edge_energy(rgb: np.ndarray) -> float:
    """Mean Sobel gradient magnitude of the gray image."""
    return float(filters.sobel(color.rgb2gray(rgb)).mean())


def saturation(rgb: np.ndarray) -> float:
    """Mean HSV saturation."""
    return float(color.rgb2hsv(rgb)[..., 1].mean())


def stylise(model: torch.nn.Module, rgb: np.ndarray) -> np.ndarray:
    """The student's output for ``rgb`` (float32 in [0, 1]), through the app's own conversions."""
    from flask_animegan.runtime.backends import to_pixels
    from flask_animegan.runtime.backends.torch import TorchRunner

    pixels = (rgb * 255).round().astype(np.uint8)
    output = to_pixels(TorchRunner(model, "fp32")(pixels))
    assert output is not None, "the network gave NaN or infinities"
    return output.astype(np.float32) / 255


def figures(model: torch.nn.Module, photos=HELD_OUT, sides=SIDES) -> dict:
    """Per photo and side, then averaged per side: the student's and teacher's figures."""
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
    """input | teacher | student per photo and side; small rows shown at 2x, nearest."""
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


def main() -> None:
    import argparse

    from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
    from flask_animegan.runtime.weights import load_generator

    parser = argparse.ArgumentParser(
        description="The model card's figures (edge energy, saturation, PSNR against the "
                    "teacher, at 512 and 256 px) for any photos, and optionally their sheet "
                    "(input | teacher | student).")
    parser.add_argument("photos", nargs="+", help="image files, or names as in load_photo")
    parser.add_argument("--weights", default=str(SHIPPED_STYLES_DIR / "toon_demo.pt"))
    parser.add_argument("--sheet", help="write the side-by-side sheet here (JPEG)")
    args = parser.parse_args()
    model = load_generator(Path(args.weights))
    print(card_table(figures(model, photos=args.photos)))
    if args.sheet:
        Path(args.sheet).parent.mkdir(parents=True, exist_ok=True)
        samples_sheet(model, Path(args.sheet), photos=args.photos)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(REPO))
    main()
