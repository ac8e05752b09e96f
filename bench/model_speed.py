"""The generator's compute per size and execution mode, against the ceilings.

``fp32-nchw`` is plain eager float32, the reference; the other modes run the package's
backends through ``InferenceEngine.forward``, the code the server runs. Modes are timed in
turns, so a busy moment hits them alike.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from flask_animegan.config import Settings
from flask_animegan.runtime.engine import InferenceEngine
from flask_animegan.runtime.generator import Generator
from flask_animegan.runtime.weights import load_generator

from .timing import median, ratio, time_runs

REFERENCE_MODE = "fp32-nchw"


@dataclass(frozen=True)
class Repeats:
    """How often to time one (size, mode): at most ``runs``, stopping after ``budget_s``."""

    runs: int
    budget_s: float
    min_runs: int = 2


def generator_gflop(side: int) -> float:
    """GFLOP of one ``side`` x ``side`` forward pass, counted on the meta device (no compute)."""
    model = Generator().to("meta")
    with FlopCounterMode(display=False) as counter:
        model(torch.empty(1, 3, side, side, device="meta"))
    return counter.get_total_flops() / 1e9


def openvino_precisions() -> list[str]:
    """OpenVINO's precisions on this CPU; none without the extra."""
    try:
        from flask_animegan.runtime.backends.openvino import OpenVINOBackend
    except ImportError:
        return []
    return list(OpenVINOBackend(cache_dir=None, threads=1).precisions())


def modes(bf16: bool) -> list[str]:
    """The execution modes to time: bf16 only where the CPU computes it natively."""
    return ([REFERENCE_MODE, "fp32"] + (["bf16"] if bf16 else [])
            + [f"openvino-{precision}" for precision in openvino_precisions()])


def mode_of(backend: str, precision: str) -> str:
    """The mode name of an engine's choice: ``fp32``, ``bf16``, ``openvino-fp32``..."""
    return precision if backend == "torch" else f"{backend}-{precision}"


def engine_for(mode: str, models_dir: Path, style: str,
               cache_dir: Path | None = None) -> InferenceEngine:
    """The package's engine set to ``mode`` (a backend and a precision, never auto)."""
    backend, _, precision = mode.rpartition("-")
    settings = Settings(default_style=style, precision=precision, backend=backend or "torch",
                        model_cache_dir=str(cache_dir) if cache_dir else "")
    return InferenceEngine.from_settings(models_dir, settings)


@dataclass(frozen=True)
class Inputs:
    """One timed picture, as the eager reference's batch and as the engine's uint8 pixels."""

    batch: torch.Tensor
    pixels: np.ndarray

    @classmethod
    def square(cls, side: int) -> Inputs:
        batch = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(side)) * 2 - 1
        pixels = ((batch[0].permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
        return cls(batch, pixels.numpy().copy())


def runner(mode: str, models_dir: Path, style: str, weights: Path,
           cache_dir: Path | None = None) -> Callable[[Inputs], Any]:
    """A function converting one picture the way ``mode`` does."""
    if mode == REFERENCE_MODE:
        model = load_generator(weights)

        def eager(inputs: Inputs) -> torch.Tensor:
            with torch.inference_mode():
                return model(inputs.batch)

        return eager
    engine = engine_for(mode, models_dir, style, cache_dir)
    engine.prepare(0)  # INT8 is quantised and put through its guard there
    run = engine.runner(style)
    if mode_of(run.backend, run.precision) != mode:
        raise RuntimeError(f"{mode} is not usable here: {engine.status()['fidelity_notes']}")
    return lambda inputs: engine.forward(run, inputs.pixels)


def measure(sizes: list[int], repeats: dict[int, Repeats], *, models_dir: Path, style: str,
            weights: Path, ceilings: dict[str, Any], bf16: bool) -> dict[str, Any]:
    """Median seconds, GFLOP/s, ceiling fraction and speed-up per (size, mode)."""
    gflop = {side: generator_gflop(side) for side in sizes}
    with tempfile.TemporaryDirectory(prefix="animegan-bench-ov-") as cache:
        runners = {mode: runner(mode, models_dir, style, weights, Path(cache))
                   for mode in modes(bf16)}
        timed = {side: _time_in_turns(runners, side, repeats[side]) for side in sizes}
    results: list[dict[str, Any]] = []
    for side in sizes:
        reference_s = None
        best_torch = min(median(timed[side][m]) or float("inf")
                         for m in runners if m in (REFERENCE_MODE, "fp32", "bf16"))
        for mode in runners:
            seconds = timed[side][mode]
            typical = median(seconds)
            if mode == REFERENCE_MODE:
                reference_s = typical
            ceiling = ceilings["bf16_gflops"] if "bf16" in mode else ceilings["fp32_gflops"]
            achieved = gflop[side] / typical
            results.append({
                "size": side, "mode": mode, "seconds": typical, "runs": len(seconds),
                "gflops": achieved, "ceiling_fraction": ratio(achieved, ceiling),
                "speedup_vs_fp32_nchw": ratio(reference_s, typical),
                "vs_best_torch": ratio(typical, best_torch),
            })
    return {"sizes": sizes, "modes": list(runners), "gflop": {str(s): g for s, g in gflop.items()},
            "results": results}


def _time_in_turns(runners: dict[str, Callable[[Inputs], Any]], side: int,
                   plan: Repeats) -> dict[str, list[float]]:
    """Seconds per mode at ``side``: rounds of one run per mode until runs or budget end."""
    inputs = Inputs.square(side)
    seconds: dict[str, list[float]] = {mode: [] for mode in runners}
    for run in runners.values():
        run(inputs)
    for _ in range(plan.runs):
        for mode, run in runners.items():
            seconds[mode] += time_runs(lambda: run(inputs), warmup=0, runs=1)
        done = len(next(iter(seconds.values())))
        if done >= plan.min_runs and max(sum(v) for v in seconds.values()) >= plan.budget_s:
            break
    return seconds


def seconds_for(model: dict[str, Any], size: int, mode: str) -> float | None:
    """The measured median seconds of ``mode`` at ``size``, if it was measured."""
    for row in model["results"]:
        if row["size"] == size and row["mode"] == mode:
            return row["seconds"]
    return None
