"""Section 3: where the time goes for one real photo, stage by stage, with the package's code."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from flask_animegan import imaging
from flask_animegan.config import DEFAULTS
from flask_animegan.engine import InferenceEngine

from .timing import median, time_runs

STAGES = ("decode", "resize", "to_tensor", "inference", "to_image", "encode")
ENCODE_FORMATS = ("jpeg", "webp", "png")


def pipeline_once(engine: InferenceEngine, model: Any, data: bytes, size: int,
                  quality: int) -> tuple[dict[str, float], Any, bytes]:
    """Convert ``data`` once as the service does; return ms per stage, the result image, the file."""
    marks = [time.perf_counter()]
    decoded = imaging.decode_upload(data, max_pixels=DEFAULTS["ANIMEGAN_MAX_PIXELS"], size=size)
    marks.append(time.perf_counter())
    fitted = imaging.fit(decoded, size)
    marks.append(time.perf_counter())
    batch = imaging.to_tensor(fitted)
    marks.append(time.perf_counter())
    out = engine.forward(model, batch)
    marks.append(time.perf_counter())
    result = imaging.to_image(out)
    marks.append(time.perf_counter())
    encoded = imaging.encode(result, "jpeg", quality)
    marks.append(time.perf_counter())
    ms = {stage: (marks[i + 1] - marks[i]) * 1000 for i, stage in enumerate(STAGES)}
    return ms, result, encoded


def measure(data: bytes, *, size: int, runs: int, models_dir: Path, style: str,
            precision: str) -> dict[str, Any]:
    """Median ms and share per stage of ``runs`` conversions (after one warm-up), plus encode costs."""
    engine = InferenceEngine(models_dir, catalog={}, default_style=style, precision=precision)
    model = engine.model(style)
    quality = DEFAULTS["ANIMEGAN_JPEG_QUALITY"]
    pipeline_once(engine, model, data, size, quality)  # warm-up: oneDNN primitives for this shape
    laps = [pipeline_once(engine, model, data, size, quality) for _ in range(runs)]
    stage_ms = {stage: median([ms[stage] for ms, _, _ in laps]) for stage in STAGES}
    total = sum(stage_ms.values())
    _, result, encoded = laps[-1]
    encode = {}
    for fmt in ENCODE_FORMATS:
        seconds = time_runs(lambda: imaging.encode(result, fmt, quality), warmup=1, runs=max(3, runs))
        encode[fmt] = {"ms": median(seconds) * 1000,
                       "bytes": len(imaging.encode(result, fmt, quality))}
    return {
        "size": size, "precision": precision, "runs": runs, "input_bytes": len(data),
        "output_size": list(result.size), "output_jpeg_bytes": len(encoded),
        "stages_ms": stage_ms, "total_ms": total,
        "share": {stage: ms / total for stage, ms in stage_ms.items()},
        "non_inference_share": (total - stage_ms["inference"]) / total,
        "encode_quality": quality, "encode": encode,
    }
