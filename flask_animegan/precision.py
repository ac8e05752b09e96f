"""Which precision runs fastest on this CPU: decided by timing, never by flags alone."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX) and oneDNN can use it."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return (("avx512_bf16" in flags or "amx_bf16" in flags)
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def time_forward(model: nn.Module, dtype: torch.dtype, side: int, runs: int = 2) -> float:
    """Best-of-``runs`` seconds of one channels-last inference on a side x side image."""
    batch = torch.zeros(1, 3, side, side, dtype=dtype).contiguous(memory_format=torch.channels_last)
    best = float("inf")
    with torch.inference_mode():
        model(batch)  # first call: oneDNN builds its kernels for this shape
        for _ in range(runs):
            started = time.perf_counter()
            model(batch)
            best = min(best, time.perf_counter() - started)
    return best


def fastest(candidates: dict[str, nn.Module], side: int) -> tuple[str, dict[str, float]]:
    """Time each ``{precision: model}`` on a side x side image: (the fastest, the timings).

    CPU flags do not tell: with AVX512-BF16 but no AMX, some CPUs run bf16
    convolutions slower than fp32 (measured on an Intel Xeon: 1.47 s vs 1.30 s
    at 512 px), while others run them twice as fast (AMD Zen 4).
    """
    timings = {name: round(time_forward(model, DTYPES[name], side), 4)
               for name, model in candidates.items()}
    return min(timings, key=lambda name: timings[name]), timings
