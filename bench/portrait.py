"""Portrait mode's figures: ``python -m bench.portrait [--quick]``.

On tests/faces_corpus.py: face recall, IoU, false faces and time per picture for the Haar
detector and (if installed) dlib's HOG run alike, and the feathered paste's seam ratio.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from faces_corpus import corpus, face_free_photos, score

from flask_animegan.portrait import blend, detect, find_faces, paste_faces


def _hog_faces(image: Image.Image, min_size: int) -> list[tuple[float, float, float, float]]:
    """dlib's HOG detector on the same turned copies, boxes mapped to the Haar convention."""
    import dlib

    hog = dlib.get_frontal_face_detector()
    gray = np.asarray(image.convert("L"))
    found: list[tuple[float, float, float, float]] = []
    for roll in detect.ROLLS:
        turned, back = detect._turned(gray, -roll)
        upsample = 1 if min_size < 80 else 0
        for box in hog(turned, upsample):
            side = box.width() / 0.8
            cx, cy = detect._apply(back, (box.left() + box.width() / 2, box.top() + box.height() / 2 - 0.06 * side))
            if side >= min_size and all(math.dist((cx, cy), (x + s / 2, y + s / 2)) > s / 2 for x, y, s, _ in found):
                found.append((cx - side / 2, cy - side / 2, side, side))
    return found


def _detector(name: str, pictures: list[Any], free: dict[str, Image.Image]) -> dict[str, Any]:
    def boxes(image: Image.Image) -> list[tuple[float, float, float, float]]:
        if name == "haar":
            return [f.box for f in find_faces(image, min_size=48)]
        return _hog_faces(image, 48)

    started = time.perf_counter()
    found = [boxes(p.image) for p in pictures]
    seconds = (time.perf_counter() - started) / len(pictures)
    figures = score(pictures, found)
    figures["false_per_free_photo"] = sum(len(boxes(im)) for im in free.values()) / len(free)
    figures["seconds_per_picture"] = seconds
    return figures


def _seams(pictures: list[Any]) -> dict[str, float]:
    from flask_animegan.runtime.backends import to_pixels
    from flask_animegan.runtime.backends.torch import TorchRunner
    from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
    from flask_animegan.runtime.weights import load_generator

    runner = TorchRunner(load_generator(SHIPPED_STYLES_DIR / "toon_demo.pt"), "fp32")

    def convert(image: Image.Image) -> Image.Image:
        return Image.fromarray(to_pixels(runner(np.array(image.convert("RGB")))))

    feathered, hard = [], []
    for picture in pictures:
        image = picture.image.resize((640, 480))
        scene = convert(image)
        for face in find_faces(image, min_size=48):
            feathered.append(blend.seam_ratio(paste_faces(image, [face], scene, convert, 256), face, 256))
            saved = blend.INNER
            blend.INNER, _ = 0.999, blend.feather.cache_clear()
            try:  # the control: no ramp, a hard edge where the face style meets the scene style
                out = paste_faces(image, [face], scene, convert, 256)
            finally:
                blend.INNER, _ = saved, blend.feather.cache_clear()
            hard.append(blend.seam_ratio(out, face, 256))
    return {"faces": len(feathered), "feathered_max": max(feathered), "feathered_median": float(np.median(feathered)),
            "hard_median": float(np.median(hard))}


def measure(quick: bool = False) -> dict[str, Any]:
    pictures = corpus(6 if quick else 24)
    free = face_free_photos()
    results: dict[str, Any] = {"pictures": len(pictures), "haar": _detector("haar", pictures, free)}
    try:
        import dlib  # noqa: F401
    except ImportError:
        results["hog"] = {"error": "dlib-bin is not installed"}
    else:
        results["hog"] = _detector("hog", pictures, free)
    results["seams"] = _seams(pictures[:2 if quick else 6])
    return results


def render(results: dict[str, Any]) -> str:
    header = ("| detector | recall (>= 80 px, IoU >= 0.6) | mean IoU | false/corpus picture "
              "| false/face-free photo | s/picture |")
    rows = [header, "|---|---|---|---|---|---|"]
    for name in ("haar", "hog"):
        r = results[name]
        if "error" in r:
            rows.append(f"| {name} | {r['error']} | | | | |")
            continue
        rows.append(f"| {name} | {r['recall']:.3f} of {r['faces']} | {r['mean_iou']:.3f} | "
                    f"{r['false_per_picture']:.3f} | {r['false_per_free_photo']:.2f} | {r['seconds_per_picture']:.2f} |")
    s = results["seams"]
    rows.append(f"\nseam ratio (band/interior gradient energy, toon_demo, {s['faces']} faces): "
                f"feathered median {s['feathered_median']:.2f}, max {s['feathered_max']:.2f} (target <= 1.5); "
                f"hard paste median {s['hard_median']:.2f}")
    return f"## Portrait mode ({results['pictures']} corpus pictures)\n" + "\n".join(rows)


if __name__ == "__main__":
    figures = measure(quick="--quick" in sys.argv)
    print(render(figures))
    print(json.dumps(figures, indent=2))
