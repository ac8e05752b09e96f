"""Scale-out on one machine: one instance against two behind nginx, and Redis cache hits
against memory ones. ``python -m bench.scale_out [--quick] [--out PATH]``.

Expect a ratio near 1 on a small machine: one inference already spreads over every core,
so a second instance only splits them; more instances pay off on more machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from . import servers
from .cache import VARIANTS, timed_post
from .ceilings import usable_cpus
from .clients import Conversion, summarise
from .inputs import REPO, Weights, jpeg, photo, prepare_weights
from .report import num, table
from .service import ours_env
from .timing import median, ratio

DEFAULT_OUT = REPO / "bench" / "results" / "scale_out.json"


@dataclass(frozen=True)
class ScalePlan:
    size: int  # long side of the conversions
    clients: int  # at once, through nginx
    per_client: int  # conversions each, in a row (at most 6: nginx's per-address burst)
    hit_repeats: int  # cache hits timed per storage (at most 4: bench.cache's variants)


FULL = ScalePlan(size=512, clients=4, per_client=3, hit_repeats=4)
QUICK = ScalePlan(size=128, clients=2, per_client=1, hit_repeats=2)


# --- the servers: gunicorn (bench.servers), nginx and Redis from deploy/ -------------------------

@contextlib.contextmanager
def nginx(upstream_ports: Sequence[int], folder: Path) -> Iterator[str]:
    """deploy/nginx.conf in front of ``upstream_ports``; yields its URL."""
    with servers.NginxServer(folder, upstream_ports, access_log=False) as server:
        yield server.url


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """redis-server with deploy/redis.conf on a free loopback port; yields its URI."""
    with servers.RedisServer(folder, shipped=True) as server:
        yield server.uri


# --- throughput through nginx ---------------------------------------------------------------------

class _FromAddress(HTTPAdapter):
    """Connections from one loopback source address: nginx limits requests per address."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


def _convert(session: requests.Session, url: str, data: bytes) -> Conversion:
    """One conversion; on a 503 that nginx could not place elsewhere, wait Retry-After."""
    outcome = Conversion()
    started = time.perf_counter()
    while True:
        sent = time.perf_counter()
        try:
            response = session.post(url, files={"image": ("photo.jpg", data, "image/jpeg")},
                                    timeout=600)
        except requests.RequestException as exc:
            outcome.attempts.append((exc.__class__.__name__, time.perf_counter() - sent))
            break
        outcome.attempts.append((str(response.status_code), time.perf_counter() - sent))
        outcome.status = response.status_code
        if response.status_code != 503 or outcome.retries >= 20:
            break
        outcome.retries += 1
        time.sleep(max(1, int(response.headers.get("Retry-After", "1"))))
    outcome.seconds = time.perf_counter() - started
    return outcome


def run_clients(url: str, data: bytes, clients: int, per_client: int) -> dict[str, Any]:
    """``clients`` threads, each from its own address, convert ``per_client`` photos."""
    barrier = threading.Barrier(clients + 1)
    done: list[Conversion] = []

    def client(index: int) -> None:
        session = requests.Session()
        session.mount("http://", _FromAddress(f"127.0.3.{index + 10}"))
        barrier.wait()
        for _ in range(per_client):
            done.append(_convert(session, url, data))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return summarise(done, clients, per_client, time.perf_counter() - started)


def measure_instances(count: int, weights: Weights, data: bytes, plan: ScalePlan,
                      workdir: Path) -> dict[str, Any]:
    """``count`` instances sharing the CPUs' torch threads, behind nginx, under load."""
    threads = max(1, usable_cpus() // count)
    env = ours_env(weights, ANIMEGAN_TORCH_THREADS=str(threads), ANIMEGAN_TRUSTED_PROXIES="1",
                   ANIMEGAN_MAX_QUEUE="8")
    with contextlib.ExitStack() as stack:
        instances = [stack.enter_context(servers.ours(f"scale-{count}x{threads}-{i}", env,
                                                      workdir / "logs"))
                     for i in range(count)]
        url = stack.enter_context(nginx([s.port for s in instances], workdir / f"nginx-{count}"))
        for instance in instances:  # each runs this shape once before the clock starts
            requests.post(f"{instance.url}/animegan/convert?size={plan.size}", timeout=600,
                          files={"image": ("photo.jpg", data, "image/jpeg")}).raise_for_status()
        cpu_before = sum(s.worker_cpu_seconds() for s in instances)
        run = run_clients(f"{url}/animegan/convert?size={plan.size}", data, plan.clients,
                          plan.per_client)
        run["worker_cpu_s"] = sum(s.worker_cpu_seconds() for s in instances) - cpu_before
        run["cpu_s_per_image"] = ratio(run["worker_cpu_s"], run["ok"])
        run["precision"] = instances[0].health()["precision"]
    return {"instances": count, "torch_threads_each": threads, **run}


# --- cache hits ------------------------------------------------------------------------------------

def measure_hits(storage_uri: str, name: str, weights: Weights, plan: ScalePlan,
                 workdir: Path) -> dict[str, Any]:
    """Median seconds of a cache hit (a re-encoded copy after the original) on one instance."""
    env = ours_env(weights, ANIMEGAN_CACHE_TTL="3600", ANIMEGAN_STORAGE_URI=storage_uri)
    image = photo()
    hits, misses, headers = [], [], []
    with servers.ours(f"hits-{name}", env, workdir / "logs") as server:
        url = f"{server.url}/animegan/convert?size={plan.size}"
        timed_post(url, jpeg(VARIANTS[-1](image), 90))  # this shape once, off the clock
        for make_variant in VARIANTS[:plan.hit_repeats]:
            variant = make_variant(image)
            miss_s, miss_header = timed_post(url, jpeg(variant, 90))
            hit_s, hit_header = timed_post(url, jpeg(variant, 85))
            misses.append(miss_s)
            hits.append(hit_s)
            headers.append((miss_header, hit_header))
        health = server.health()
    return {"storage_uri": storage_uri.split("@")[-1], "hit_s": median(hits),
            "miss_s": median(misses), "hits_confirmed": sum(h == "HIT" for _, h in headers),
            "repeats": len(hits), "health_storage": health.get("storage")}


def redis_keys(uri: str) -> int:
    """Keys in the Redis at ``uri``: above 0 when the app really stored its cache there."""
    import redis

    return int(redis.Redis.from_url(uri, socket_timeout=2).dbsize())


# --- the section -----------------------------------------------------------------------------------

def measure(weights: Weights, data: bytes, plan: ScalePlan, workdir: Path) -> dict[str, Any]:
    """Both comparisons; every figure from this run."""
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    one = measure_instances(1, weights, data, plan, workdir)
    two = measure_instances(2, weights, data, plan, workdir)
    memory = measure_hits("memory://", "memory", weights, plan, workdir)
    with redis_server(workdir / "redis") as uri:
        shared = measure_hits(uri, "redis", weights, plan, workdir)
        shared["keys_in_redis_after"] = redis_keys(uri)
    return {
        "cpus": usable_cpus(), "size": plan.size, "clients": plan.clients,
        "per_client": plan.per_client, "one": one, "two": two,
        "two_vs_one_throughput": ratio(two["throughput_per_s"], one["throughput_per_s"]),
        "hits": {"memory": memory, "redis": shared,
                 "redis_vs_memory_hit": ratio(shared["hit_s"], memory["hit_s"])},
    }


def render(section: dict[str, Any]) -> str:
    """The section as markdown."""
    rows = []
    for run in (section["one"], section["two"]):
        statuses = " ".join(f"{k}:{v}" for k, v in run["statuses"].items())
        rows.append([f"{run['instances']} x {run['torch_threads_each']} torch threads",
                     f"{run['ok']}/{run['conversions']}", statuses, run["retries_503"],
                     num(run["throughput_per_s"], 3), num(run["latency_s"]["p50"]),
                     num(run["latency_s"]["p95"]), num(run["cpu_s_per_image"])])
    hits = section["hits"]
    hit_rows = [[name, num(h["hit_s"], 4), num(h["miss_s"], 3),
                 f"{h['hits_confirmed']}/{h['repeats']}"]
                for name, h in (("memory://", hits["memory"]), ("redis://", hits["redis"]))]
    keys = hits["redis"].get("keys_in_redis_after")
    quick = " (--quick: smoke sizes, not the real figures)" if section.get("quick") else ""
    return "\n".join([
        f"## Scale-out{quick} on {section['cpus']} CPUs ({section['clients']} clients x "
        f"{section['per_client']} conversions at {section['size']} px, through nginx with "
        "deploy/nginx.conf; cache and rate limit off)",
        table(["instances", "ok", "statuses", "503 retried", "conv/s", "p50 s", "p95 s",
               "CPU s/img"], rows),
        f"\ntwo/one throughput: {num(section['two_vs_one_throughput'])}x (expected: about "
        "1x). One inference already uses every core through torch's intra-op threads, so "
        "on one machine a second instance splits the same cores (and holds a second copy "
        "of the model); instances add throughput when they add machines.",
        "\n## Cache hit: Redis against memory (same photo re-encoded, q90 then q85)",
        table(["storage", "hit median s", "miss median s", "X-Cache: HIT"], hit_rows),
        f"\nredis/memory hit: {num(hits['redis_vs_memory_hit'])}x; keys in Redis afterwards: "
        f"{keys} (0 means the cache did not use Redis)",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_out",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 128 px, few requests")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where to write the JSON (default: {DEFAULT_OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="animegan-scale-out-") as folder:
        workdir = Path(folder)
        weights = prepare_weights(workdir / "models")
        section = measure(weights, jpeg(photo()), QUICK if args.quick else FULL, workdir)
    section["quick"] = args.quick
    section["duration_s"] = time.monotonic() - started
    print(render(section))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(section, indent=2) + "\n")
    print(f"\n({section['duration_s']:.0f} s; wrote {args.out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
