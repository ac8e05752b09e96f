"""Section 1: the machine, and what its matmul units deliver (the ceilings we compare to)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from flask_animegan.runtime.precision import native_bf16

from .timing import time_runs


def usable_cpus() -> int:
    """CPUs this process may run on (affinity/cgroup aware), as the package counts them."""
    return len(os.sched_getaffinity(0))


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """CPU, CPU count, library versions, the precision ``auto`` picks here, and the load."""
    import torchvision

    return {
        "cpu_model": cpu_model(),
        "usable_cpus": usable_cpus(),
        "logical_cpus": os.cpu_count(),
        "native_bf16": native_bf16(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        # another busy process makes every figure pessimistic (OpenMP threads spin-wait)
        "load_average_1m_at_start": os.getloadavg()[0],
    }


def matmul_gflops(n: int, dtype: torch.dtype, runs: int) -> float:
    """Best-of-``runs`` GFLOP/s of an ``n x n @ n x n`` matmul in ``dtype``."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(dtype)
    b = torch.randn(n, n, generator=generator).to(dtype)
    seconds = time_runs(lambda: torch.mm(a, b), warmup=2, runs=runs)
    return 2 * n**3 / min(seconds) / 1e9


def measure(n: int, runs: int, bf16: bool) -> dict[str, Any]:
    """fp32 (and, when the CPU has native bf16, bf16) matmul ceilings in GFLOP/s."""
    return {
        "matmul_n": n,
        "runs": runs,
        "fp32_gflops": matmul_gflops(n, torch.float32, runs),
        "bf16_gflops": matmul_gflops(n, torch.bfloat16, runs) if bf16 else None,
    }
