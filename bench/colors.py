"""Colour keeping (``colors=off|luma|keep``): how close it gets and what it costs.

``python -m bench.colors [--quick]``: mean CIEDE2000 and brightness error to the input on
six scikit-image photos, and ``keep_colors``'s time and peak memory at 512 and 4096 px.
The tests use its photo list and converter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import skimage.data
from PIL import Image
from skimage import color

from flask_animegan.convert.colors import COLOR_MODES, brightness, keep_colors
from flask_animegan.inputs.decoding import fit
from flask_animegan.runtime.backends import to_pixels
from flask_animegan.runtime.backends.torch import TorchRunner
from flask_animegan.runtime.weights import load_generator

#: the photos, chosen before measuring
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "motorcycle", "retina")
SIDE = 512


def photo(name: str) -> Image.Image:
    """One of :data:`PHOTOS` as an RGB image."""
    if name == "motorcycle":
        array = skimage.data.stereo_motorcycle()[0]
    else:
        array = getattr(skimage.data, name)()
    return Image.fromarray(np.asarray(array)).convert("RGB")


class Converter:
    """A style's network run the way the app runs it (TorchRunner, fp32)."""

    def __init__(self, weights: Path) -> None:
        self.runner = TorchRunner(load_generator(weights), "fp32")

    def __call__(self, image: Image.Image) -> Image.Image:
        pixels = to_pixels(self.runner(np.array(image)))  # writable, as torch wants
        assert pixels is not None, "the network gave NaN or infinities"
        return Image.fromarray(pixels)


def ciede2000(a: Image.Image, b: Image.Image) -> float:
    """Mean CIEDE2000 distance between two RGB pictures of the same size."""
    lab_a = color.rgb2lab(np.asarray(a))
    lab_b = color.rgb2lab(np.asarray(b))
    return float(color.deltaE_ciede2000(lab_a, lab_b).mean())


def fidelity(convert: Converter, photos: tuple[str, ...] = PHOTOS,
             side: int = SIDE) -> dict[str, dict[str, dict[str, float]]]:
    """Per photo and mode: mean CIEDE2000 to the input and mean-brightness error."""
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name in photos:
        source = fit(photo(name), side)
        result = convert(source)
        rows[name] = {}
        for mode in COLOR_MODES:
            kept = keep_colors(result, source, mode)
            rows[name][mode] = {
                "ciede2000": round(ciede2000(kept, source), 3),
                "brightness_error": round(abs(brightness(kept) - brightness(source)), 2),
            }
    return rows


def summary(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The means over the photos, and what keep (ΔE00) and luma (brightness) save."""
    means = {mode: {key: round(float(np.mean([r[mode][key] for r in rows.values()])), 3)
                    for key in ("ciede2000", "brightness_error")} for mode in COLOR_MODES}
    return {
        "mean": means,
        "keep_saving": round(1 - means["keep"]["ciede2000"] / means["off"]["ciede2000"], 3),
        "worst_keep_saving": round(min(1 - r["keep"]["ciede2000"] / r["off"]["ciede2000"]
                                       for r in rows.values()), 3),
        "luma_brightness_saving": round(
            1 - means["luma"]["brightness_error"] / means["off"]["brightness_error"], 3),
    }


def _time(call: Any, runs: int) -> float:
    laps = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        laps.append(time.perf_counter() - started)
    return statistics.median(laps)


_PEAK_SCRIPT = """
import json, sys, numpy as np
from PIL import Image
from flask_animegan.convert.colors import keep_colors
side, mode = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
result = Image.fromarray(rng.integers(0, 256, (side, side, 3), np.uint8))
source = Image.fromarray(rng.integers(0, 256, (side, side, 3), np.uint8))
keep_colors(result.resize((64, 64)), source.resize((64, 64)), mode)  # the tables, imports
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
before = status("VmRSS")
out = keep_colors(result, source, mode)
print(json.dumps({"peak_over_inputs_mib": (status("VmHWM") - before) / 2**20,
                  "output_mib": side * side * 3 / 2**20}))
"""


def peak_memory(side: int, mode: str) -> dict[str, float]:
    """Peak RSS of one ``keep_colors`` at ``side`` px over its inputs, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(side), mode],
                          check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(done.stdout)
    return {key: round(value, 1) for key, value in figures.items()}


def cost(convert: Converter, *, quick: bool) -> dict[str, Any]:
    """Seconds of ``keep_colors`` per mode at 512 and 4096 px against the inference's."""
    rng = np.random.default_rng(0)
    source = fit(photo("astronaut"), SIDE)
    inference_512 = _time(lambda: convert(source), 1 if quick else 3)
    result = convert(source)
    figures: dict[str, Any] = {"inference_512_s": round(inference_512, 4),
                               "inference_4096_s_scaled": round(inference_512 * 64, 1)}
    sides = (512,) if quick else (512, 4096)
    for side in sides:
        if side == SIDE:
            res, src = result, source
        else:
            res = Image.fromarray(rng.integers(0, 256, (side, side, 3), np.uint8))
            src = Image.fromarray(rng.integers(0, 256, (side, side, 3), np.uint8))
        for mode in ("luma", "keep"):
            seconds = _time(lambda res=res, src=src, mode=mode: keep_colors(res, src, mode),
                            1 if side > 1024 else 5)
            inference = inference_512 * (side / SIDE) ** 2
            figures[f"{mode}_{side}_s"] = round(seconds, 4)
            figures[f"{mode}_{side}_vs_inference"] = round(seconds / inference, 4)
        del res, src
    peak_side = 1024 if quick else 4096
    figures["peak_side"] = peak_side
    figures["peak"] = {mode: peak_memory(peak_side, mode) for mode in ("luma", "keep")}
    return figures


def measure(weights: Path, *, quick: bool = False) -> dict[str, Any]:
    """The section: fidelity on the photos, then the cost."""
    convert = Converter(weights)
    rows = fidelity(convert, PHOTOS[:2] if quick else PHOTOS, 256 if quick else SIDE)
    return {"weights": weights.name, "side": 256 if quick else SIDE, "photos": rows,
            **summary(rows), "cost": cost(convert, quick=quick)}


def render(section: dict[str, Any]) -> str:
    """The section as markdown tables."""
    from .report import table

    rows = []
    for name, modes in section["photos"].items():
        off, keep = modes["off"]["ciede2000"], modes["keep"]["ciede2000"]
        rows.append([name] + [f"{modes[m]['ciede2000']:.2f}" for m in COLOR_MODES]
                    + [f"{(1 - keep / off) * 100:.0f} %"]
                    + [f"{modes[m]['brightness_error']:.1f}" for m in COLOR_MODES])
    mean = section["mean"]
    rows.append(["mean"] + [f"{mean[m]['ciede2000']:.2f}" for m in COLOR_MODES]
                + [f"{section['keep_saving'] * 100:.0f} %"]
                + [f"{mean[m]['brightness_error']:.1f}" for m in COLOR_MODES])
    c = section["cost"]
    cost_rows = [[mode, side, f"{c[f'{mode}_{side}_s'] * 1000:.1f}",
                  f"{c[f'{mode}_{side}_vs_inference'] * 100:.1f} %"]
                 for side in (512, 4096) for mode in ("luma", "keep") if f"{mode}_{side}_s" in c]
    peak = c["peak"]
    return "\n\n".join([
        (f"{section['weights']}, photos fitted to {section['side']} px; CIEDE2000 to the "
         "input (lower is closer) and |mean brightness - input's| (Rec. 601 luma, 0-255)"),
        table(["photo", "ΔE00 off", "ΔE00 luma", "ΔE00 keep", "keep saves",
               "bright. off", "bright. luma", "bright. keep"], rows),
        (f"inference at 512 px: {c['inference_512_s'] * 1000:.0f} ms "
         f"(scaled by pixels to 4096 px: {c['inference_4096_s_scaled']:.0f} s)"),
        table(["mode", "side px", "keep_colors ms", "of the inference"], cost_rows),
        f"peak memory of one keep_colors at {c['peak_side']} px over its inputs: "
        + ", ".join(f"{mode} {p['peak_over_inputs_mib']:.0f} MiB" for mode, p in peak.items())
        + f" (the output itself is {peak['keep']['output_mib']:.0f} MiB)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.colors",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from flask_animegan.process import configure_process

    from .ceilings import usable_cpus
    from .inputs import prepare_weights

    configure_process(usable_cpus())
    with tempfile.TemporaryDirectory(prefix="animegan-bench-colors-") as workdir:
        weights = prepare_weights(Path(workdir) / "models")
        section = measure(weights.path, quick=args.quick)
    print(render(section))
    if args.out:
        args.out.write_text(json.dumps(section, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
