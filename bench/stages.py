"""Section 3: where the time goes for one real photo, stage by stage, with the package's code."""

from __future__ import annotations

import io
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from flask_animegan.cache import NearDuplicateCache
from flask_animegan.config import Settings
from flask_animegan.outputs import stills as formats
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.convert.converter import Converter
from flask_animegan.convert.request import ConvertRequest
from flask_animegan.runtime.engine import InferenceEngine

from .timing import median, time_runs

#: The converter's stages of a JPEG that misses the cache: its lookup, the one decode (and
#: fit), the near-duplicate lookup on what was fitted, the network (with its tensor
#: conversions and the colours), the encode.
STAGES = ("lookup", "decode", "cache", "inference", "encode")
ENCODE_FORMATS = ("jpeg", "webp", "png")


def make_pipeline(models_dir: Path, style: str, precision: str,
                  backend: str = "torch", isolation: str = "process") -> Converter:
    """The service's converter as served: a memory cache, decodes in helper processes (or,
    with ``isolation="thread"``, in this process), the model warmed up (and ``auto`` settled)
    at the app's warm-up size."""
    settings = Settings(default_style=style, precision=precision, backend=backend,
                        decode_isolation=isolation)
    engine = InferenceEngine.from_settings(models_dir, settings)
    engine.prepare(settings.warmup_size)  # as the service's warm-up does: INT8 is settled there
    decoder = Decoder.from_settings(settings)
    decoder.start()
    cache = NearDuplicateCache(ttl=settings.cache_ttl, max_bytes=settings.cache_max_bytes,
                               max_distance=settings.phash_max_distance)
    return Converter(decoder, engine, quality=settings.jpeg_quality, cache=cache)


def _outside_in_process(data: bytes, size: int, runs: int, models_dir: Path, style: str,
                        precision: str, backend: str) -> dict[str, float]:
    """The decode stage and the share outside the model with ``ANIMEGAN_DECODE_ISOLATION=thread``."""
    pipeline = make_pipeline(models_dir, style, precision, backend, isolation="thread")
    pipeline_once(pipeline, data, size)
    laps = [pipeline_once(pipeline, data, size) for _ in range(runs)]
    total = median([sum(ms[stage] for stage in STAGES) for ms, _, _ in laps])
    outside = median([sum(ms[stage] for stage in STAGES) - ms["model"] for ms, _, _ in laps])
    return {"decode_ms": median([ms["decode"] for ms, _, _ in laps]),
            "outside_model_ms": outside, "outside_model_share": outside / total}


_clients = itertools.count()


def pipeline_once(pipeline: Converter, data: bytes, size: int) -> tuple[dict[str, float], Any, bytes]:
    """Convert ``data`` once as the service does, as a new client's (a cache miss); ms per
    stage and the model's, image, file."""
    style = pipeline.engine.style(None)
    model_ms = _time_forward(pipeline.engine)
    conversion = pipeline.photo(data, ConvertRequest(style, size, "jpeg"),
                                scope=f"bench-{next(_clients)}")
    assert not conversion.cache_hit
    timings = conversion.timings
    ms = {"lookup": timings["lookup"], "decode": timings["decode"], "cache": timings["cache"],
          "inference": timings["infer"], "encode": timings["encode"], "model": sum(model_ms)}
    result = Image.open(io.BytesIO(conversion.data)).convert("RGB")
    return ms, result, conversion.data


def _time_forward(engine: InferenceEngine) -> list[float]:
    """Record each ``engine.forward`` call's ms, for the share outside the model."""
    calls: list[float] = []
    forward = type(engine).forward

    def timed(runner: Any, pixels: np.ndarray) -> np.ndarray:
        started = time.perf_counter()
        try:
            return forward(engine, runner, pixels)
        finally:
            calls.append((time.perf_counter() - started) * 1000)

    engine.forward = timed  # type: ignore[method-assign]
    return calls


def measure(data: bytes, *, size: int, runs: int, models_dir: Path, style: str,
            precision: str, backend: str = "torch") -> dict[str, Any]:
    """Median ms and share per stage of ``runs`` conversions, the model's own, encode costs;
    and the share outside the model when the decode runs in this process instead, the floor
    that giving up the helper's isolation would reach."""
    pipeline = make_pipeline(models_dir, style, precision, backend)
    quality = pipeline.quality
    pipeline_once(pipeline, data, size)  # warm-up: kernels for this shape
    laps = [pipeline_once(pipeline, data, size) for _ in range(runs)]
    stage_ms = {stage: median([ms[stage] for ms, _, _ in laps]) for stage in STAGES}
    total = sum(stage_ms.values())
    outside = median([sum(ms[stage] for stage in STAGES) - ms["model"] for ms, _, _ in laps])
    model_ms = total - outside
    _, result, encoded = laps[-1]
    in_process = _outside_in_process(data, size, runs, models_dir, style, precision, backend)
    encode = {}
    for fmt in ENCODE_FORMATS:
        seconds = time_runs(lambda: formats.encode(result, fmt, quality), warmup=1, runs=max(3, runs))
        encode[fmt] = {"ms": median(seconds) * 1000,
                       "bytes": len(formats.encode(result, fmt, quality))}
    return {
        "size": size, "precision": precision, "backend": backend, "runs": runs,
        "input_bytes": len(data),
        "output_size": list(result.size), "output_jpeg_bytes": len(encoded),
        "stages_ms": stage_ms, "total_ms": total,
        "share": {stage: ms / total for stage, ms in stage_ms.items()},
        "non_inference_share": (total - stage_ms["inference"]) / total,
        "model_ms": model_ms,
        "outside_model_ms": outside,
        "outside_model_share": outside / total,
        "in_process": in_process,
        "encode_quality": quality, "encode": encode,
    }
