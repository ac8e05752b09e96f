"""Section 2: the generator's compute per size and execution mode, against the ceilings.

Modes: ``fp32-nchw`` is plain eager float32 (the reference everybody starts from);
``fp32`` and ``bf16`` are the package's own engine (``InferenceEngine._prepare`` and
``InferenceEngine.forward``: channels_last, in that dtype), so what is timed is the
code the server runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from flask_animegan.config import Settings
from flask_animegan.engine import InferenceEngine
from flask_animegan.generator import Generator
from flask_animegan.weights import load_generator

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


def modes(bf16: bool) -> list[str]:
    """The execution modes to time: bf16 only where the CPU computes it natively."""
    return [REFERENCE_MODE, "fp32"] + (["bf16"] if bf16 else [])


def runner(mode: str, models_dir: Path, style: str, weights: Path) -> Callable[[torch.Tensor], Any]:
    """A function converting a (1, 3, H, W) batch the way ``mode`` does."""
    if mode == REFERENCE_MODE:
        model = load_generator(weights)

        def eager(batch: torch.Tensor) -> torch.Tensor:
            with torch.inference_mode():
                return model(batch)

        return eager
    engine = InferenceEngine.from_settings(models_dir, Settings(default_style=style,
                                                                precision=mode))
    prepared = engine.model(style)
    return lambda batch: engine.forward(prepared, batch)


def measure(sizes: list[int], repeats: dict[int, Repeats], *, models_dir: Path, style: str,
            weights: Path, ceilings: dict[str, Any], bf16: bool) -> dict[str, Any]:
    """Median seconds, GFLOP/s, ceiling fraction and speed-up per (size, mode)."""
    gflop = {side: generator_gflop(side) for side in sizes}
    runners = {mode: runner(mode, models_dir, style, weights) for mode in modes(bf16)}
    results: list[dict[str, Any]] = []
    for side in sizes:
        batch = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(side)) * 2 - 1
        reference_s = None
        for mode, run in runners.items():
            plan = repeats[side]
            seconds = time_runs(lambda: run(batch), warmup=1, runs=plan.runs,
                                min_runs=plan.min_runs, budget_s=plan.budget_s)
            typical = median(seconds)
            if mode == REFERENCE_MODE:
                reference_s = typical
            ceiling = ceilings["bf16_gflops"] if mode == "bf16" else ceilings["fp32_gflops"]
            achieved = gflop[side] / typical
            results.append({
                "size": side, "mode": mode, "seconds": typical, "runs": len(seconds),
                "gflops": achieved, "ceiling_fraction": ratio(achieved, ceiling),
                "speedup_vs_fp32_nchw": ratio(reference_s, typical),
            })
    return {"sizes": sizes, "modes": list(runners), "gflop": {str(s): g for s, g in gflop.items()},
            "results": results}


def seconds_for(model: dict[str, Any], size: int, mode: str) -> float | None:
    """The measured median seconds of ``mode`` at ``size``, if it was measured."""
    for row in model["results"]:
        if row["size"] == size and row["mode"] == mode:
            return row["seconds"]
    return None
