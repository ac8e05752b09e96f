"""Which backend and precision run fastest on this CPU: decided by timing, never by flags alone."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX) and oneDNN can use it."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return (("avx512_bf16" in flags or "amx_bf16" in flags)
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def fastest(candidates: Mapping[str, Callable[[np.ndarray], object]], side: int,
            runs: int = 2) -> tuple[list[str], dict[str, float]]:
    """Time each candidate, best of ``runs`` rounds in turn (CPU flags cannot tell:
    docs/benchmark.md); (names fastest first, seconds)."""
    # noise: no shortcut applies
    pixels = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    for run in candidates.values():
        run(pixels)  # first call: oneDNN / OpenVINO build their kernels for this shape
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(runs):
        for name, run in candidates.items():
            started = time.perf_counter()
            run(pixels)
            best[name] = min(best[name], time.perf_counter() - started)
    timings = {name: round(seconds, 4) for name, seconds in best.items()}
    return sorted(timings, key=lambda name: timings[name]), timings
