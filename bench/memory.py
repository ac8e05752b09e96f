"""Section 6: ours' worker memory, at its peak on large images and over many requests."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import requests

from . import servers
from .inputs import Weights
from .plan import Plan
from .service import ours_env


def convert_many(session: requests.Session, base_url: str, data: bytes,
                 sizes: list[int]) -> dict[str, int]:
    """Convert ``data`` once per entry of ``sizes``, in a row; return counts by status."""
    statuses: dict[str, int] = {}
    for size in sizes:
        response = session.post(f"{base_url}?size={size}", timeout=600,
                                files={"image": ("photo.jpg", data, "image/jpeg")})
        statuses[str(response.status_code)] = statuses.get(str(response.status_code), 0) + 1
    return statuses


def measure(weights: Weights, data: bytes, plan: Plan, log_dir: Path) -> dict[str, Any]:
    """Peak and current RSS after large conversions, then RSS growth over many small ones."""
    env = ours_env(weights, ANIMEGAN_MAX_SIDE=str(plan.memory_max_side))
    small = itertools.cycle(plan.memory_small_sizes)
    with servers.ours("ours-memory", env, log_dir) as server, requests.Session() as session:
        url = f"{server.url}/animegan/convert"
        at_start = server.worker_memory_mib()
        large = convert_many(session, url, data, [plan.memory_max_side] * plan.memory_large_requests)
        after_large = server.worker_memory_mib()
        warm = convert_many(session, url, data, [next(small) for _ in range(plan.memory_warmup)])
        before = server.worker_memory_mib()
        many = convert_many(session, url, data, [next(small) for _ in range(plan.memory_requests)])
        after = server.worker_memory_mib()
    return {
        "max_side": plan.memory_max_side, "large_requests": plan.memory_large_requests,
        "large_statuses": large,
        "rss_at_start_mib": at_start["VmRSS"],
        "peak_rss_mib": after_large["VmHWM"], "rss_after_large_mib": after_large["VmRSS"],
        "small_sizes": list(plan.memory_small_sizes), "warmup_requests": plan.memory_warmup,
        "requests": plan.memory_requests, "small_statuses": _merge(warm, many),
        "rss_before_mib": before["VmRSS"], "rss_after_mib": after["VmRSS"],
        "peak_rss_end_mib": after["VmHWM"],
        "rss_growth_pct": (after["VmRSS"] - before["VmRSS"]) / before["VmRSS"] * 100,
    }


def _merge(*counts: dict[str, int]) -> dict[str, int]:
    """Add up counts by status."""
    merged: dict[str, int] = {}
    for count in counts:
        for status, n in count.items():
            merged[status] = merged.get(status, 0) + n
    return merged
