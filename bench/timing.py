"""Small timing and statistics helpers shared by the sections."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence


def time_runs(fn: Callable[[], object], *, warmup: int = 1, runs: int = 5,
              min_runs: int = 1, budget_s: float = math.inf) -> list[float]:
    """Seconds of up to ``runs`` calls after ``warmup``; ``budget_s`` ends it after ``min_runs``."""
    for _ in range(warmup):
        fn()
    seconds: list[float] = []
    while len(seconds) < runs:
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
        if len(seconds) >= min_runs and sum(seconds) >= budget_s:
            break
    return seconds


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The ``pct`` percentile with linear interpolation (numpy's default), or None."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator
