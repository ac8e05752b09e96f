"""The INT8 stretch of the OpenVINO backend: post-training quantisation with NNCF, measured.

Run: ``.venv/bin/pip install nncf && .venv/bin/python -m bench.int8``.

The shipped ``toon_demo`` style is converted exactly as the backend converts it
(``backends.openvino.convert``), quantised by ``nncf.quantize`` (default preset,
calibrated on nine photos that ship in scikit-image's wheel, none of them a fidelity photo),
and compiled next to the f32 model with the same threads. Reported: model-only time at
512 and 1024 px (medians, the two models in turns) and PSNR against torch fp32 with the
fidelity guard's own photos and measure (``backends.fidelity``). The backend would keep
INT8 only at >= 35 dB and faster.
Not part of ``python -m bench``: nncf is not a dependency of the package.

Measured on AMD EPYC (2 cores, AVX2, no VNNI-512/AMX), NNCF 3.4.0, OpenVINO 2026.4.1: INT8
took 0.52x the f32 time at 512 px (0.679 against 1.307 s) and 0.54x at 1024 px (2.715
against 5.046 s), but reached only 27.9-30.3 dB against torch fp32 on the guard's photos
(f32: 87-90 dB), under the 35 dB bar: so the backend offers no INT8.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import skimage.data
from PIL import Image

from flask_animegan.inputs import decoding
from flask_animegan.process import configure_process
from flask_animegan.runtime.backends import fidelity
from flask_animegan.runtime.backends import openvino as ovb
from flask_animegan.runtime.backends.torch import TorchRunner
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
from flask_animegan.runtime.weights import load_generator

from . import ceilings

CALIBRATION = ("rocket", "stereo_motorcycle", "hubble_deep_field",
               "immunohistochemistry", "retina", "camera", "coins", "grass", "brick")


def pixels(image: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(image.convert("RGB"), np.uint8))


def calibration_images(side: int) -> list[np.ndarray]:
    images = []
    for name in CALIBRATION:
        array = getattr(skimage.data, name)()
        array = array[0] if isinstance(array, tuple) else array
        images.append(pixels(decoding.fit(Image.fromarray(np.asarray(array)).convert("RGB"), side)))
    return images


def main() -> int:
    import nncf
    import openvino as ov

    threads = configure_process(ceilings.usable_cpus())
    network = load_generator(SHIPPED_STYLES_DIR / "toon_demo.pt").eval()
    model = ovb.convert(network)
    started = time.perf_counter()
    dataset = nncf.Dataset(calibration_images(512), lambda image: image[np.newaxis])
    quantized = nncf.quantize(model, dataset, subset_size=len(CALIBRATION))
    quantise_s = time.perf_counter() - started
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
              "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    core = ov.Core()
    compiled = {"f32": core.compile_model(model, "CPU", config),
                "int8": core.compile_model(quantized, "CPU", config)}
    requests = {name: c.create_infer_request() for name, c in compiled.items()}

    def run(name: str, image: np.ndarray) -> np.ndarray:
        return requests[name].infer({0: image[np.newaxis]})[0][0]

    print(f"# INT8 (NNCF {nncf.__version__}, OpenVINO {ov.get_version()}), {threads} threads, "
          f"CPU {ceilings.machine_info()['cpu_model']}\n")
    print(f"quantisation: {quantise_s:.1f} s on {len(CALIBRATION)} photos at 512 px\n")
    # the fidelity guard's own photos and measure, as it would judge an INT8 candidate
    reference = fidelity.pictures(TorchRunner(network, "fp32"))
    made = {name: fidelity.pictures(lambda image, name=name: run(name, image))
            for name in compiled}
    print("| photo | px | PSNR int8 vs torch fp32 | PSNR OpenVINO f32 vs torch fp32 |")
    print("| --- | --- | --- | --- |")
    for index, (photo, expected) in enumerate(zip(fidelity.PHOTOS, reference)):
        values = {name: fidelity.psnr(expected, made[name][index]) for name in compiled}
        print(f"| {photo} | {expected.shape[1]}x{expected.shape[0]} | {values['int8']:.1f} dB "
              f"| {values['f32']:.1f} dB |")
    print("\n| px | f32 s | int8 s | int8 / f32 |\n| --- | --- | --- | --- |")
    for side in (512, 1024):
        image = np.ascontiguousarray(np.resize(calibration_images(side)[0], (side, side, 3)))
        times: dict[str, list[float]] = {name: [] for name in compiled}
        for name in compiled:
            run(name, image)  # first run allocates
        for _ in range(5 if side == 512 else 3):
            for name in compiled:
                began = time.perf_counter()
                run(name, image)
                times[name].append(time.perf_counter() - began)
        f32, int8 = (statistics.median(times[name]) for name in ("f32", "int8"))
        print(f"| {side} | {f32:.3f} | {int8:.3f} | {int8 / f32:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
