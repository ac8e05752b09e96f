"""The benchmark's targets, each checked against this run's figures (reported, never gated on)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

AT_MOST, AT_LEAST, BELOW = "≤", "≥", "<"
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    AT_MOST: operator.le, AT_LEAST: operator.ge, BELOW: operator.lt}


def _model_fraction(results: dict[str, Any], size: int, mode: str) -> float | None:
    for row in results.get("model", {}).get("results", ()):
        if row["size"] == size and row["mode"] == mode:
            return row["ceiling_fraction"]
    return None


def _get(results: dict[str, Any], *keys: str) -> Any:
    """results[k1][k2]..., or None where any level is missing."""
    value: Any = results
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _best_backend_vs_torch(results: dict[str, Any], size: int) -> float | None:
    """The fastest non-torch mode's model time over the best torch eager mode's, at ``size``."""
    rows = [r for r in results.get("model", {}).get("results", ()) if r["size"] == size]
    torch_s = [r["seconds"] for r in rows if r["mode"] in ("fp32-nchw", "fp32", "bf16")]
    other_s = [r["seconds"] for r in rows if r["mode"].startswith("openvino-")]
    return min(other_s) / min(torch_s) if torch_s and other_s else None


def _backend_rows(results: dict[str, Any], key: str) -> float | None:
    """The worst ``key`` over the OpenVINO rows of section 7 that started warm."""
    rows = [r for r in _get(results, "backends", "rows") or ()
            if r["mode"].startswith("openvino-") and r["start"] == "warm" and r.get(key)]
    return max(r[key] for r in rows) if rows else None


def check(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what it asks, the goal, the measured value and pass/miss."""
    sizes = results["plan"]["model_sizes"]
    large = 512 if 512 in sizes else max(sizes)
    small = 256 if 256 in sizes else min(sizes)
    top = max(results["plan"]["client_levels"])
    queue = results["plan"]["overload_queue"]
    rows: list[tuple[str, str, float, Any]] = [
        (f"model fp32 (channels_last) at {large}px, fraction of fp32 ceiling", AT_LEAST, 0.70,
         _model_fraction(results, large, "fp32")),
    ]
    if _get(results, "machine", "native_bf16"):
        rows += [
            (f"model bf16 at {large}px, fraction of bf16 ceiling", AT_LEAST, 0.75,
             _model_fraction(results, large, "bf16")),
            (f"model bf16 at {small}px, fraction of bf16 ceiling", AT_LEAST, 0.85,
             _model_fraction(results, small, "bf16")),
        ]
    bf16 = bool(_get(results, "machine", "native_bf16"))
    for side in sorted({large, max(sizes)}):
        rows.append((f"fastest OpenVINO mode vs best torch eager, model at {side}px"
                     f" ({'native bf16' if bf16 else 'no native bf16: fp32'})", AT_MOST,
                     0.75 if bf16 else 0.85, _best_backend_vs_torch(results, side)))
    rows += [
        ("1080x1350 JPEG end to end: non-inference share", AT_MOST, 0.10,
         _get(results, "stages", "non_inference_share")),
        (f"1080x1350 JPEG to {_get(results, 'stages', 'size')}px: share outside the model",
         AT_MOST, 0.05, _get(results, "stages", "outside_model_share")),
        ("OpenVINO, warm-cache restart: first inference vs steady", AT_MOST, 1.5,
         _backend_rows(results, "first_vs_steady")),
        ("OpenVINO, warm-cache restart: worker RSS ready vs torch's", AT_MOST, 1.3,
         _backend_rows(results, "rss_ready_vs_torch")),
        ("OpenVINO, warm-cache restart: peak RSS serving vs torch's", AT_MOST, 1.3,
         _backend_rows(results, "peak_vs_torch")),
        ("OpenVINO, warm-cache restart: RSS once idle vs torch's", AT_MOST, 1.3,
         _backend_rows(results, "rss_idle_vs_torch")),
        (f"throughput at {top} clients x model time (vs 1/model time)", AT_LEAST, 0.9,
         _get(results, "service", "ratios", "throughput_x_model_s")),
        (f"throughput at {top} clients vs baseline (a) original", AT_LEAST, 4.0,
         _get(results, "service", "ratios", "throughput_vs_original")),
        (f"throughput at {top} clients vs baseline (b) optimized", AT_LEAST, 2.5,
         _get(results, "service", "ratios", "throughput_vs_optimized")),
        ("first request after startup vs steady single-client p50", AT_MOST, 1.5,
         _get(results, "service", "ratios", "first_vs_steady")),
        (f"worker CPU s per image, {top} clients vs 1 (no oversubscription, ≈ 1)", AT_MOST, 1.10,
         _get(results, "service", "ratios", "cpu_per_image_top_vs_single")),
        ("overload: slowest 503 vs single-client p50 (prompt)", AT_MOST, 1.0,
         _get(results, "service", "ratios", "overload_max_503_vs_single")),
        (f"overload: slowest 200 vs (1 + queue {queue}) x single-client p50", AT_MOST, 1.0,
         _get(results, "service", "ratios", "overload_max_200_vs_queue_bound")),
        ("cache: a near-duplicate hit's time vs a miss's, through the service", AT_MOST, 0.05,
         _get(results, "cache", "times", "near_hit_vs_miss")),
        ("cache: same-photo JPEG re-encodes (q70-95, same size) that hit", AT_LEAST, 0.90,
         _get(results, "cache", "reencode_hit_share")),
        ("cache: visible local edits (1 or 3 % of the picture) that hit", AT_MOST, 0.02,
         _get(results, "cache", "visible_edit_hit_share")),
        ("cache: another client's hits", AT_MOST, 0, _get(results, "cache", "other_client_hits")),
        (f"RSS growth over {results['plan']['memory_requests']} requests, %", BELOW, 5.0,
         _get(results, "memory", "rss_growth_pct")),
        ("jobs: frames/s on the job path vs images/s on the photo path, same size", AT_LEAST,
         0.9, _get(results, "jobs", "throughput", "job_vs_photo")),
        ("jobs: held H.264 shots (crf 18-28) reused, least share", AT_LEAST, 0.9,
         _get(results, "jobs", "rule", "held_min_share")),
        ("jobs: held-shot clip, time with reuse vs without", BELOW, 1.0,
         _get(results, "jobs", "saving", "time_vs_without")),
        ("jobs: worker RSS growth from frame 50 to the end of a 250-frame job, %", BELOW, 5.0,
         _get(results, "jobs", "memory", "rss_growth_pct")),
        ("colors=keep: mean CIEDE2000 to the input vs colors=off, saving", AT_LEAST, 0.5,
         _get(results, "colors", "keep_saving")),
        ("colors=luma: mean brightness error vs colors=off, saving", AT_LEAST, 0.9,
         _get(results, "colors", "luma_brightness_saving")),
    ]
    return [{"target": name, "goal": f"{sign} {goal:g}", "measured": value,
             "pass": None if value is None else _COMPARE[sign](value, goal)}
            for name, sign, goal, value in rows]
