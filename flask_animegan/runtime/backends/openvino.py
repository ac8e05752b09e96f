"""OpenVINO on the CPU: each style traced, converted with dynamic height and width,
compiled, and cached on disk. GroupNorm becomes MVN, which runs as fast as a static shape,
so no shape buckets (padding) are needed."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import functools
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import torch
from torch import nn

from .. import generator
from ..weights import torchscript_quietly
from .int8 import RECIPE_VERSION as INT8_RECIPE_VERSION
from .int8 import missing as int8_missing
from .int8 import quantize as int8_quantize
from .int8 import version as int8_version

log = logging.getLogger("flask_animegan")

#: Bump when the conversion below changes: it is part of every cache key.
CONVERSION_VERSION = "1"
#: int8: the quantised model's FakeQuantize nodes make its convolutions int8; the rest f32
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
#: Side of the tracing input (any size works: height and width are dynamic).
TRACE_SIDE = 32

_compiled: dict[tuple[str, str, int, str], ov.CompiledModel] = {}
_compiled_lock = threading.Lock()


@functools.cache
def core() -> ov.Core:
    """The process's OpenVINO core (made on first use, not at import)."""
    return ov.Core()


def version() -> str:
    return str(ov.get_version())


def convert(network: nn.Module) -> ov.Model:
    """``network`` as an OpenVINO model: uint8 (1, H, W, 3) in, float32 in [-1, 1] out."""
    if not isinstance(network, torch.jit.ScriptModule):  # TorchScript files are fp32 already
        # a copy: the caller's network may be serving (channels-last) at the same time
        network = generator.in_layout(copy.deepcopy(network).float(), torch.contiguous_format)
    example = torch.zeros(1, 3, TRACE_SIDE, TRACE_SIDE)
    # tracing ourselves without the trace check takes a third of convert_model's own
    with torchscript_quietly(), warnings.catch_warnings(), torch.no_grad():
        # the trace sees GroupNorm's batch-size check; the batch is always 1 here
        warnings.filterwarnings(
            "ignore", category=torch.jit.TracerWarning)  # type: ignore[attr-defined]
        traced = network if isinstance(network, torch.jit.ScriptModule) else (
            torch.jit.trace(network, example, check_trace=False))
        model = ov.convert_model(traced, input=[ov.PartialShape([1, 3, -1, -1])])
    _group_norm_as_mvn(model)
    return _with_pixel_conversions(model)


def _group_norm_as_mvn(model: ov.Model) -> None:
    """Replace one-group GroupNormalization by MVN times scale plus shift."""
    axes = ops.constant(np.array([1, 2, 3], np.int64))
    per_channel = ops.constant(np.array([1, -1, 1, 1], np.int64))
    for node in model.get_ordered_ops():
        if node.get_type_name() != "GroupNormalization":
            continue
        attributes = node.get_attributes()
        if attributes["num_groups"] != 1:
            continue
        data, scale, shift = (node.input_value(i) for i in range(3))
        normalised = ops.mvn(data, axes, True, attributes["epsilon"], "inside_sqrt")
        out = ops.add(ops.multiply(normalised, ops.reshape(scale, per_channel, False)),
                      ops.reshape(shift, per_channel, False))
        node.output(0).replace(out.output(0))
    model.validate_nodes_and_infer_types()


def _with_pixel_conversions(model: ov.Model) -> ov.Model:
    """Put the pixel conversions (uint8 NHWC in, NHWC out) in the graph, to be fused."""
    ppp = ov.preprocess.PrePostProcessor(model)
    ppp.input().tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC"))
    ppp.input().model().set_layout(ov.Layout("NCHW"))
    ppp.input().preprocess().convert_element_type(ov.Type.f32).scale(127.5).mean(1.0)
    ppp.output().model().set_layout(ov.Layout("NCHW"))
    ppp.output().tensor().set_layout(ov.Layout("NHWC"))
    built: ov.Model = ppp.build()
    return built


def cache_key(weights: Path, digest: str) -> str:
    """What the converted model depends on: weights, code, conversion and versions."""
    parts = [digest, hashlib.sha256(Path(generator.__file__).read_bytes()).hexdigest(),
             CONVERSION_VERSION, torch.__version__, version()]
    return f"{weights.stem}-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:20]}"


def int8_key(key: str) -> str:
    """The quantised model's cache key: the converted one's, the recipe and NNCF's version."""
    recipe = hashlib.sha256(f"{INT8_RECIPE_VERSION}|{int8_version()}".encode()).hexdigest()
    return f"{key}-int8-{recipe[:8]}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """One process converts a style at a time (gunicorn's workers start together)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class OpenVINORunner:
    """One compiled style with its own infer request (the engine's gate serialises calls)."""

    backend = "openvino"

    def __init__(self, compiled: ov.CompiledModel, precision: str) -> None:
        self.precision = precision
        self.compiled = compiled
        self.request = compiled.create_infer_request()

    def release_memory(self) -> None:
        """Give back the buffers sized for the largest picture so far (refused while
        another app runs the model: a later idle moment does it)."""
        try:
            self.compiled.release_memory()
        except RuntimeError as exc:
            if "busy state" not in str(exc):
                raise

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        results = self.request.infer({0: pixels[np.newaxis]}, share_inputs=True,
                                     share_outputs=False)
        out: np.ndarray = results[0][0]
        return out


class OpenVINOBackend:
    """Converts, caches and compiles styles; see the module docstring."""

    name = "openvino"

    def __init__(self, *, cache_dir: Path | None, threads: int) -> None:
        # blobs are tied to OpenVINO's build: one folder per version
        tag = re.sub(r"[^A-Za-z0-9.]+", "-", version())
        self.cache_dir = cache_dir / f"openvino-{tag}" if cache_dir else None
        self.threads = threads
        # per weights file: where its model came from and what it cost (for /healthz)
        self.loads: dict[str, dict[str, Any]] = {}
        self._cache_problem_logged = False

    def status(self) -> dict[str, Any]:
        """Version, threads, cache folder and, per loaded style, what its start cost."""
        return {"version": version(), "threads": self.threads,
                "cache_dir": str(self.cache_dir) if self.cache_dir else None,
                "loads": dict(self.loads)}

    def precisions(self) -> tuple[str, ...]:
        """fp32; bf16 where the CPU computes it; int8 where NNCF is installed."""
        capabilities = core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        native = ("fp32", "bf16") if "BF16" in capabilities else ("fp32",)
        return native + (("int8",) if int8_missing() is None else ())

    def runner(self, network: nn.Module, precision: str, weights: Path) -> OpenVINORunner:
        from .base import weights_digest

        key = cache_key(weights, weights_digest(weights))
        memo = (key, precision, self.threads, str(self.cache_dir))
        with _compiled_lock:
            compiled = _compiled.get(memo)
            if compiled is None:
                compiled = self._compile(network, precision, key, weights.stem)
                _compiled[memo] = compiled
        return OpenVINORunner(compiled, precision)

    def _compile(self, network: nn.Module, precision: str, key: str,
                 style: str) -> ov.CompiledModel:
        started = time.perf_counter()
        source: ov.Model | str
        source, converted = self._model(network, key, precision)
        converted_s = time.perf_counter() - started
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision],
            "INFERENCE_NUM_THREADS": self.threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
            **({"CACHE_DIR": str(self.cache_dir / "compiled")} if self.cache_dir else {})}
        try:
            compiled = core().compile_model(source, "CPU", config)
        except RuntimeError:
            if "CACHE_DIR" not in config:
                raise
            config.pop("CACHE_DIR")  # an unusable cache folder never stops the style
            compiled = core().compile_model(source, "CPU", config)
        from_cache = bool(compiled.get_property("LOADED_FROM_CACHE"))
        self.loads[f"{style} {precision}"] = {
            "converted": converted, "compiled_from_cache": from_cache,
            **({"quantized": converted} if precision == "int8" else {}),
            "convert_s": round(converted_s, 3),
            "compile_s": round(time.perf_counter() - started - converted_s, 3)}
        made = "converted and quantised" if precision == "int8" else "converted"
        log.info("flask_animegan: openvino %s %s: %s in %.2f s, %s in %.2f s", style, precision,
                 made if converted else f"{made} model read from the cache", converted_s,
                 "compiled blob loaded from the cache" if from_cache else "compiled",
                 time.perf_counter() - started - converted_s)
        return compiled

    def _model(self, network: nn.Module, key: str,
               precision: str) -> tuple[ov.Model | str, bool]:
        """The converted (int8: quantised) model, cached or in memory; whether this call made it."""
        if precision == "int8":
            key = int8_key(key)
        if self.cache_dir is None:
            return self._make(network, precision), True
        folder = self.cache_dir / "ir"
        xml = folder / f"{key}.xml"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with _file_lock(folder / f"{key}.lock"):
                if xml.is_file():
                    return str(xml), False
                model = self._make(network, precision)
                self._save(model, xml)
                return str(xml), True
        except OSError as exc:
            if not self._cache_problem_logged:
                log.warning("flask_animegan: openvino cache folder %s is not usable (%s); "
                            "converting in memory: set ANIMEGAN_MODEL_CACHE_DIR to a "
                            "writable folder", self.cache_dir, exc)
                self._cache_problem_logged = True
            self.cache_dir = None
            return self._make(network, precision), True

    @staticmethod
    def _make(network: nn.Module, precision: str) -> ov.Model:
        model = convert(network)
        if precision != "int8":
            return model
        quantized: ov.Model = int8_quantize(model)
        return quantized

    @staticmethod
    def _save(model: ov.Model, xml: Path) -> None:
        """Write ``xml`` and its ``.bin`` so that a reader never sees half a model."""
        with tempfile.TemporaryDirectory(dir=xml.parent, prefix=".tmp-") as tmp:
            staged = Path(tmp) / xml.name
            ov.save_model(model, str(staged), compress_to_fp16=False)
            os.replace(staged.with_suffix(".bin"), xml.with_suffix(".bin"))
            os.replace(staged, xml)
