"""OpenVINO INT8 through NNCF's post-training quantisation, variant by variant.

``python -m bench.int8 [--sensitivity] [--accuracy-control]``: each variant of the shipped
style, converted as the backend converts it, is scored by the fidelity guard's lowest PSNR
at two sizes and timed against OpenVINO f32 (docs/benchmark.md gives the bar and results).
The sensitivity table keeps one quantiser at a time, and every quantiser but one.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import skimage.data
from PIL import Image

from flask_animegan.inputs import decoding
from flask_animegan.process import configure_process
from flask_animegan.runtime.backends import fidelity, int8
from flask_animegan.runtime.backends import openvino as ovb
from flask_animegan.runtime.backends.base import to_pixels
from flask_animegan.runtime.backends.torch import TorchRunner
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
from flask_animegan.runtime.weights import load_generator

from . import ceilings

CALIBRATION = ("rocket", "stereo_motorcycle", "hubble_deep_field",
               "immunohistochemistry", "retina", "camera", "coins", "grass", "brick")
#: For accuracy control's validation: skimage photos that are neither calibration nor guard.
VALIDATION = ("colorwheel", "gravel", "moon", "clock", "cell", "horse")
MIN_DB = 35.0
MAX_RATIO = 0.7


def pixels(image: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(image.convert("RGB"), np.uint8))


def skimage_photos(names: tuple[str, ...], side: int) -> list[np.ndarray]:
    images = []
    for name in names:
        array = getattr(skimage.data, name)()
        array = array[0] if isinstance(array, tuple) else array
        images.append(pixels(decoding.fit(Image.fromarray(np.asarray(array)).convert("RGB"), side)))
    return images


def calibration_images(side: int, names: tuple[str, ...] = CALIBRATION) -> list[np.ndarray]:
    return skimage_photos(names, side)


def guard_photos(side: int) -> tuple[np.ndarray, ...]:
    """The guard's photos at its own size, or fitted (Lanczos) to ``side`` px."""
    if side == fidelity.SIDE:
        return fidelity.photos()
    arrays = []
    for name in fidelity.PHOTOS:
        with Image.open(fidelity.PHOTOS_DIR / name) as image:
            image = image.convert("RGB")
        scale = side / max(image.size)
        size = (round(image.width * scale), round(image.height * scale))
        arrays.append(pixels(image.resize(size, Image.Resampling.LANCZOS)))
    return tuple(arrays)


@dataclass
class Variant:
    name: str
    fp_layers: str  # what stays in floating point, in words
    calibration: tuple[int, int] = (9, 256)  # photos, side
    options: dict[str, Any] = field(default_factory=dict)  # nncf.quantize keywords
    advanced: dict[str, Any] = field(default_factory=dict)  # AdvancedQuantizationParameters
    ignored: dict[str, Any] = field(default_factory=dict)  # IgnoredScope keywords

    def describe(self) -> str:
        parts = [f"{key}={value}" for key, value in {**self.options, **self.advanced}.items()]
        return ", ".join(parts) or "defaults"


FIRST_LAST = ["__module.block_a.0.1/aten::_convolution/Convolution",
              "__module.out_layer.0/aten::_convolution/Convolution"]


def variants() -> list[Variant]:
    from nncf import ModelType, QuantizationPreset
    from nncf.quantization.advanced_parameters import (
        AdvancedSmoothQuantParameters,
        OverflowFix,
    )

    mvn = {"types": ["MVN"]}
    enable = {"overflow_fix": OverflowFix.ENABLE}
    mixed = {"preset": QuantizationPreset.MIXED}
    return [
        Variant("default", "none"),
        Variant("overflow-fix", "none", advanced=enable),
        Variant("no-mvn-inputs", "MVN inputs (conv outputs)", ignored=mvn),
        Variant("mixed", "none", options=mixed),
        Variant("mixed+overflow", "none", options=mixed, advanced=enable),
        Variant("mixed+overflow+no-mvn", "MVN inputs", options=mixed, advanced=enable,
                ignored=mvn),
        Variant("..+bias-correction", "MVN inputs",
                options={**mixed, "fast_bias_correction": False}, advanced=enable, ignored=mvn),
        Variant("..+no-bias-correction", "MVN inputs", options=mixed,
                advanced={**enable, "disable_bias_correction": True}, ignored=mvn),
        Variant("..+smooth-quant 0.5", "MVN inputs",
                options={**mixed, "model_type": ModelType.TRANSFORMER},
                advanced={**enable, "smooth_quant_alphas":
                          AdvancedSmoothQuantParameters(convolution=0.5)}, ignored=mvn),
        Variant("..+calibration 9x512", "MVN inputs", calibration=(9, 512), options=mixed,
                advanced=enable, ignored=mvn),
        Variant("..+calibration 5x256", "MVN inputs", calibration=(5, 256), options=mixed,
                advanced=enable, ignored=mvn),
        Variant("..+first/last conv fp", "MVN inputs, first and last conv", options=mixed,
                advanced=enable, ignored={**mvn, "names": FIRST_LAST}),
        Variant("..+calibration 9x384", "MVN inputs", calibration=(9, 384), options=mixed,
                advanced=enable, ignored=mvn),
        Variant("..+calibration 9x512+first/last", "MVN inputs, first and last conv",
                calibration=(9, 512), options=mixed, advanced=enable,
                ignored={**mvn, "names": FIRST_LAST}),
        Variant("performance+overflow+no-mvn+first/last", "MVN inputs, first and last conv",
                advanced=enable, ignored={**mvn, "names": FIRST_LAST}),
        Variant(SHIPPED, "MVN inputs", calibration=(len(int8.CALIBRATION),
                                                     int8.CALIBRATION_SIDE),
                options=mixed, advanced=enable, ignored=mvn),
    ]


SHIPPED = "shipped (backends.int8)"


def quantise(model: Any, variant: Variant) -> tuple[Any, float]:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

    if variant.name == SHIPPED:
        started = time.perf_counter()
        return int8.quantize(model), time.perf_counter() - started
    count, side = variant.calibration
    images = calibration_images(side)[:count]
    started = time.perf_counter()
    quantized = nncf.quantize(
        model, nncf.Dataset(images, lambda image: image[np.newaxis]), subset_size=count,
        ignored_scope=nncf.IgnoredScope(**variant.ignored, validate=False)
        if variant.ignored else None,
        advanced_parameters=AdvancedQuantizationParameters(**variant.advanced),
        **variant.options)
    return quantized, time.perf_counter() - started


class Models:
    """Compiled models and the torch fp32 references of the guard's photos at two sizes."""

    SIDES = (fidelity.SIDE, 512)

    def __init__(self, network: Any, threads: int) -> None:
        import openvino as ov

        self.core = ov.Core()
        self.config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                       "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
        reference = TorchRunner(network, "fp32")
        self.photos = {side: guard_photos(side) for side in self.SIDES}
        self.expected = {side: [to_pixels(reference(photo)) for photo in photos]
                         for side, photos in self.photos.items()}

    def compile(self, model: Any) -> Callable[[np.ndarray], np.ndarray]:
        request = self.core.compile_model(model, "CPU", self.config).create_infer_request()

        def run(image: np.ndarray) -> np.ndarray:
            out: np.ndarray = request.infer({0: image[np.newaxis]})[0][0]
            return out
        return run

    def db(self, run: Callable[[np.ndarray], np.ndarray], side: int) -> float:
        made = [to_pixels(run(photo)) for photo in self.photos[side]]
        return min(fidelity.psnr(a, b) if b is not None else 0.0
                   for a, b in zip(self.expected[side], made))


def timed(runs: dict[str, Callable[[np.ndarray], np.ndarray]], side: int,
          rounds: int) -> dict[str, float]:
    """Median seconds per model at side x side, every model in turns each round."""
    image = np.ascontiguousarray(np.resize(calibration_images(side)[0], (side, side, 3)))
    for run in runs.values():
        run(image)  # first run allocates
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            began = time.perf_counter()
            run(image)
            times[name].append(time.perf_counter() - began)
    return {name: statistics.median(values) for name, values in times.items()}


def sensitivity(model: Any, models: Models) -> None:
    """Per quantiser: the dB with it alone, and with every other one."""
    import nncf
    import openvino as ov

    quantized = nncf.quantize(model, nncf.Dataset(calibration_images(256),
                                                  lambda image: image[np.newaxis]),
                              subset_size=len(CALIBRATION))
    weights = {node.get_friendly_name(): node.input_value(1).get_node().get_data()
               for node in model.get_ordered_ops()
               if node.get_type_name() in ("Convolution", "GroupConvolution")}
    quantisers = [node.get_friendly_name() for node in quantized.get_ordered_ops()
                  if node.get_type_name() == "FakeQuantize"]

    def variant(keep: set[str], float_weights: bool) -> Any:
        copy = quantized.clone()
        for node in copy.get_ordered_ops():
            kind, name = node.get_type_name(), node.get_friendly_name()
            if kind == "FakeQuantize" and name not in keep:
                node.output(0).replace(node.input_value(0))
            if float_weights and name in weights:
                node.input(1).replace_source_output(ov.opset13.constant(weights[name]).output(0))
        copy.validate_nodes_and_infer_types()
        return copy

    side = fidelity.SIDE
    every = set(quantisers)
    print(f"\n## Sensitivity (default options, 9 photos at 256 px; dB at {side} px)\n")
    print(f"- all {len(quantisers)} activation quantisers and int8 weights: "
          f"{models.db(models.compile(quantized), side):.2f} dB")
    print(f"- int8 weights only: {models.db(models.compile(variant(set(), False)), side):.2f} dB")
    print(f"- every activation quantiser, float weights: "
          f"{models.db(models.compile(variant(every, True)), side):.2f} dB\n")
    print("| quantiser (its input's node) | alone, float weights | all but it, int8 weights |")
    print("| --- | --- | --- |")
    for name in quantisers:
        alone = models.db(models.compile(variant({name}, True)), side)
        others = models.db(models.compile(variant(every - {name}, False)), side)
        short = name.replace("__module.", "").replace("/fq_output_0", "")
        print(f"| {short} | {alone:.2f} | {others:.2f} |", flush=True)


def accuracy_control(model: Any, models: Models, reference: Any) -> Any:
    """nncf.quantize_with_accuracy_control with the guard's measure on VALIDATION photos."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedAccuracyRestorerParameters,
        AdvancedQuantizationParameters,
        OverflowFix,
    )

    validation = skimage_photos(VALIDATION, 256)
    expected = [to_pixels(reference(photo)) for photo in validation]
    compiled_cache: dict[int, Callable[[np.ndarray], np.ndarray]] = {}

    def validate(compiled: Any, items: Any) -> tuple[float, list[float]]:
        request = compiled.create_infer_request()
        values = []
        for index, image in items:
            out = request.infer({0: image[np.newaxis]})[0][0]
            made = to_pixels(out)
            values.append(min(fidelity.psnr(expected[index], made), 99.0)
                          if made is not None else 0.0)
        return min(values), values

    del compiled_cache
    started = time.perf_counter()
    quantized = nncf.quantize_with_accuracy_control(
        model, nncf.Dataset(calibration_images(256), lambda image: image[np.newaxis]),
        nncf.Dataset(list(enumerate(validation)), lambda item: item[1][np.newaxis]),
        validate, max_drop=99.0 - MIN_DB, subset_size=len(CALIBRATION),
        preset=nncf.QuantizationPreset.MIXED,
        advanced_quantization_parameters=AdvancedQuantizationParameters(
            overflow_fix=OverflowFix.ENABLE),
        advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
            max_num_iterations=8))
    return quantized, time.perf_counter() - started


#: Photos for the side-by-side sheet, neither calibration nor guard photos.
SHEET_PHOTOS = ("astronaut", "coffee")


def side_by_side(path: str, network: Any, model: Any, models: Models) -> None:
    """A sheet per photo: the photo, torch fp32, INT8 and their difference x8, with PSNR."""
    from PIL import ImageDraw

    reference = TorchRunner(network, "fp32")
    quantised = models.compile(int8.quantize(model))
    rows = []
    print(f"\n## Side by side ({path}): photo | torch fp32 | INT8 | difference x 8\n")
    for name, photo in zip(SHEET_PHOTOS, skimage_photos(SHEET_PHOTOS, 512)):
        fp32, eight = to_pixels(reference(photo)), to_pixels(quantised(photo))
        assert fp32 is not None and eight is not None
        signed = eight.astype(np.int16) - fp32
        difference = np.clip(128 + 8 * signed, 0, 255).astype(np.uint8)
        worst = np.abs(signed).max()
        print(f"- {name} {photo.shape[1]}x{photo.shape[0]}: {fidelity.psnr(fp32, eight):.1f} dB, "
              f"largest difference {worst} levels")
        rows.append(np.concatenate([photo, fp32, eight, difference], axis=1))
    width = max(row.shape[1] for row in rows)
    sheet = Image.new("RGB", (width, sum(row.shape[0] + 24 for row in rows)), "white")
    top = 0
    for name, row in zip(SHEET_PHOTOS, rows):
        ImageDraw.Draw(sheet).text(
            (4, top + 6), f"{name}: photo | torch fp32 | INT8 (shipped recipe) | "
            "difference x 8 (grey: none)", fill="black")
        sheet.paste(Image.fromarray(row), (0, top + 24))
        top += row.shape[0] + 24
    sheet.save(path)


def main(argv: list[str] | None = None) -> int:
    import nncf
    import openvino as ov

    parser = argparse.ArgumentParser(prog="python -m bench.int8")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument("--accuracy-control", action="store_true")
    parser.add_argument("--only", help="comma-separated variant names")
    parser.add_argument("--side-by-side", metavar="PNG", help="write the fp32 / INT8 sheet "
                        "of two photos at 512 px there, and stop")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds at 512 px "
                        "(1024 px: one fewer, at least 3)")
    args = parser.parse_args(argv)
    nncf.set_log_level(logging.ERROR)
    threads = configure_process(ceilings.usable_cpus())
    network = load_generator(SHIPPED_STYLES_DIR / "toon_demo.pt").eval()
    model = ovb.convert(network)
    models = Models(network, threads)
    print(f"# INT8 (NNCF {nncf.__version__}, OpenVINO {ov.get_version()}), {threads} threads, "
          f"CPU {ceilings.machine_info()['cpu_model']}")
    if args.side_by_side:
        side_by_side(args.side_by_side, network, model, models)
        return 0
    if args.sensitivity:
        sensitivity(model, models)
    chosen = variants()
    if args.only:
        wanted = set(args.only.split(","))
        chosen = [variant for variant in chosen if variant.name in wanted]
    runs = {"f32": models.compile(model)}
    rows = []
    for variant in chosen:
        quantized, seconds = quantise(model, variant)
        run = runs[variant.name] = models.compile(quantized)
        rows.append((variant, seconds, {side: models.db(run, side) for side in models.SIDES}))
    if args.accuracy_control:
        quantized, seconds = accuracy_control(model, models, TorchRunner(network, "fp32"))
        variant = Variant("accuracy-control", "what NNCF reverted", options={
            "preset": "MIXED", "max_drop": f"{99 - MIN_DB} dB"}, advanced={"overflow_fix": "ENABLE"})
        run = runs[variant.name] = models.compile(quantized)
        rows.append((variant, seconds, {side: models.db(run, side) for side in models.SIDES}))
    times = timed(runs, 512, args.rounds)
    print("\n## Variants (dB: lowest over the guard's photos against torch fp32; "
          f"time: model only, median of {args.rounds} in turns)\n")
    print("| variant | kept in float | options | calibration | quantise s | dB 128 px "
          "| dB 512 px | 512 px s | / f32 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| f32 | all | - | - | - | {models.db(runs['f32'], 128):.1f} "
          f"| {models.db(runs['f32'], 512):.1f} | {times['f32']:.3f} | 1.00 |")
    for variant, seconds, db in rows:
        count, side = variant.calibration
        print(f"| {variant.name} | {variant.fp_layers} | {variant.describe()} "
              f"| {count} x {side} px | {seconds:.1f} | {db[128]:.1f} | {db[512]:.1f} "
              f"| {times[variant.name]:.3f} | {times[variant.name] / times['f32']:.2f} |")
    passing = [row for row in rows if min(row[2].values()) >= MIN_DB
               and times[row[0].name] <= MAX_RATIO * times["f32"]]
    finalists = passing or [max(rows, key=lambda row: min(row[2].values()))]
    big = timed({"f32": runs["f32"], **{row[0].name: runs[row[0].name] for row in finalists}},
                1024, max(3, args.rounds - 1))
    print(f"\n## At 1024 px ({'those passing at 512' if passing else 'none passes; the closest'}"
          f", median of {max(3, args.rounds - 1)} in turns)\n")
    print("| variant | lowest dB | 512 px / f32 | 1024 px s | / f32 |\n| --- | --- | --- | --- | --- |")
    print(f"| f32 | - | 1.00 | {big['f32']:.3f} | 1.00 |")
    for variant, _, db in finalists:
        name = variant.name
        print(f"| {name} | {min(db.values()):.1f} | {times[name] / times['f32']:.2f} "
              f"| {big[name]:.3f} | {big[name] / big['f32']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
