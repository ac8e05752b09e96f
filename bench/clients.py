"""Concurrent HTTP clients: threads that post the photo and record statuses and latencies."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests

from .timing import percentile

MAX_RETRIES = 20


@dataclass
class Conversion:
    """One photo a client wanted converted: how it ended, and how long it took in all."""

    status: int | None = None  # the final HTTP status; None: no answer (connection error)
    seconds: float = 0.0  # from the first attempt to the final answer, Retry-After waits included
    retries: int = 0
    attempts: list[tuple[str, float]] = field(default_factory=list)  # (status or error, seconds)


def post_photo(url: str, data: bytes, timeout: float) -> requests.Response:
    """POST ``data`` as the multipart field ``image`` (what an HTML form sends)."""
    return requests.post(url, files={"image": ("photo.jpg", data, "image/jpeg")}, timeout=timeout)


def convert(url: str, data: bytes, *, timeout: float, retry: bool) -> Conversion:
    """Convert one photo; with ``retry``, on 503 wait Retry-After seconds and send it again."""
    outcome = Conversion()
    started = time.perf_counter()
    while True:
        sent = time.perf_counter()
        try:
            response = post_photo(url, data, timeout)
        except requests.RequestException as exc:
            outcome.attempts.append((exc.__class__.__name__, time.perf_counter() - sent))
            break
        outcome.attempts.append((str(response.status_code), time.perf_counter() - sent))
        outcome.status = response.status_code
        if response.status_code != 503 or not retry or outcome.retries >= MAX_RETRIES:
            break
        outcome.retries += 1
        time.sleep(max(1, int(response.headers.get("Retry-After", "1"))))
    outcome.seconds = time.perf_counter() - started
    return outcome


def run_clients(url: str, data: bytes, *, clients: int, per_client: int, timeout: float = 600,
                retry: bool = True) -> dict[str, Any]:
    """``clients`` threads convert ``per_client`` photos each; counts, throughput, latencies."""
    barrier = threading.Barrier(clients + 1)
    results: list[list[Conversion]] = [[] for _ in range(clients)]

    def client(index: int) -> None:
        barrier.wait()
        for _ in range(per_client):
            results[index].append(convert(url, data, timeout=timeout, retry=retry))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return summarise([c for per in results for c in per], clients, per_client, wall)


def summarise(conversions: list[Conversion], clients: int, per_client: int,
              wall: float) -> dict[str, Any]:
    """Counts, throughput and latency figures of one run of clients."""
    ok = [c.seconds for c in conversions if c.status == 200]
    statuses = Counter(label for c in conversions for label, _ in c.attempts)
    slowest_by_status: dict[str, float] = {}
    for conversion in conversions:
        for label, seconds in conversion.attempts:
            slowest_by_status[label] = max(seconds, slowest_by_status.get(label, 0.0))
    return {
        "clients": clients, "per_client": per_client, "conversions": len(conversions),
        "ok": len(ok), "failed": len(conversions) - len(ok),
        "statuses": dict(sorted(statuses.items())),
        "retries_503": sum(c.retries for c in conversions),
        "wall_s": wall, "throughput_per_s": len(ok) / wall if wall else 0.0,
        "latency_s": {"p50": percentile(ok, 50), "p95": percentile(ok, 95),
                      "p99": percentile(ok, 99), "max": max(ok, default=None)},
        "max_attempt_s_by_status": slowest_by_status,
    }
