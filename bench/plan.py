"""How much each section measures: the full run (under 10 minutes on 2 cores) and ``--quick``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model_speed import Repeats


@dataclass(frozen=True)
class Plan:
    """Sizes, repetitions and client counts for one bench run."""

    matmul_n: int = 2048
    matmul_runs: int = 10
    model_sizes: tuple[int, ...] = (256, 512, 1024)
    model_repeats: dict[int, Repeats] = field(default_factory=lambda: {
        256: Repeats(runs=7, budget_s=3.0),
        512: Repeats(runs=5, budget_s=6.0),
        1024: Repeats(runs=3, budget_s=12.0),
    })
    stage_size: int = 512
    stage_runs: int = 5
    service_size: int = 512
    client_levels: tuple[int, ...] = (1, 4, 8)
    per_client: dict[int, int] = field(default_factory=lambda: {1: 4, 4: 2, 8: 2})
    baseline_levels: tuple[int, ...] = (1, 4, 8)
    throughput_queue: int = 8  # ANIMEGAN_MAX_QUEUE for the throughput runs: 8 clients queue
    overload_queue: int = 2
    overload_clients: int = 12
    cache_size: int = 512
    cache_repeats: int = 3
    memory_max_side: int = 1024
    memory_large_requests: int = 3
    memory_small_sizes: tuple[int, ...] = (64, 96, 128, 160, 192, 224, 256)
    memory_warmup: int = 20
    memory_requests: int = 500
    service_torch_too: bool = True  # also serve with ANIMEGAN_BACKEND=torch when auto is not
    backend_size: int = 512
    backend_runs: int = 3


FULL = Plan()

QUICK = Plan(
    matmul_n=512, matmul_runs=3,
    model_sizes=(64, 128),
    model_repeats={64: Repeats(runs=2, budget_s=0.5, min_runs=1),
                   128: Repeats(runs=2, budget_s=0.5, min_runs=1)},
    stage_size=128, stage_runs=2,
    service_size=128, client_levels=(1, 2), per_client={1: 2, 2: 1}, baseline_levels=(1, 2),
    overload_clients=6,
    cache_size=128, cache_repeats=1,
    memory_max_side=256, memory_large_requests=1, memory_small_sizes=(64, 96, 128),
    memory_warmup=3, memory_requests=10,
    service_torch_too=False, backend_size=128, backend_runs=1,
)
