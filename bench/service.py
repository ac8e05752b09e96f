"""The service under the real gunicorn against the articles' two recipes.

Each server in turn gets the bench photo from 1, 4 and 8 clients, cache and limit off;
ours is also measured for its first request, CPU per image and overload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import servers
from .clients import convert, run_clients
from .inputs import Weights
from .plan import Plan
from .timing import ratio

#: Baselines: name -> (module in bench/, gunicorn --threads, label)
BASELINES = {
    "original": ("baseline_original", 4,
                 "articles' original recipe: model built + loaded per request, --threads 4"),
    "optimized": ("baseline_optimized", 2,
                  "articles' optimized recipe: preloaded, jit.trace, 2 threads, --threads 2"),
}


def ours_env(weights: Weights, **settings: str) -> dict[str, str]:
    """Environment for ours: the bench's single style, cache and rate limit off, plus ``settings``."""
    return {"ANIMEGAN_MODELS_DIR": str(weights.models_dir),
            "ANIMEGAN_DEFAULT_STYLE": weights.style,
            # the model cache the bench's probe filled: servers restart warm
            "ANIMEGAN_MODEL_CACHE_DIR": str(weights.models_dir.parent / "model-cache"),
            "ANIMEGAN_CACHE_TTL": "0", "ANIMEGAN_RATE_LIMIT": "", **settings}


def load_runs(server: servers.GunicornServer, url: str, data: bytes, levels: tuple[int, ...],
              per_client: dict[int, int]) -> list[dict[str, Any]]:
    """One run of clients per concurrency level, with the worker's CPU seconds per image."""
    runs = []
    for clients in levels:
        before = server.worker_cpu_seconds()
        run = run_clients(url, data, clients=clients, per_client=per_client[clients])
        run["worker_cpu_s"] = server.worker_cpu_seconds() - before
        run["cpu_s_per_image"] = ratio(run["worker_cpu_s"], run["ok"])
        runs.append(run)
    return runs


def measure_ours(weights: Weights, data: bytes, plan: Plan, log_dir: Path,
                 backend: str = "auto") -> dict[str, Any]:
    """Ours with a queue for every client: first request, then each load level."""
    settings = {"ANIMEGAN_MAX_QUEUE": str(plan.throughput_queue),
                "ANIMEGAN_BACKEND": backend}
    name = "ours" if backend == "auto" else f"ours-{backend}"
    with servers.ours(name, ours_env(weights, **settings), log_dir) as server:
        url = f"{server.url}/animegan/convert?size={plan.service_size}"
        first = convert(url, data, timeout=600, retry=False)
        runs = load_runs(server, url, data, plan.client_levels, plan.per_client)
        health = server.health()
    return {
        "command": "gunicorn -c gunicorn.conf.py example_app:app", "settings": settings,
        "precision": health["precision"], "backend": health.get("backend", "torch"),
        "torch_threads": health["torch_threads"],
        "startup_s": server.startup_s,
        "first_request": {"status": first.status, "seconds": first.seconds},
        "runs": runs,
    }


def measure_baseline(name: str, weights: Weights, data: bytes, plan: Plan,
                     log_dir: Path) -> dict[str, Any]:
    """One of the articles' recipes: one warm-up request, then each load level."""
    module, threads, label = BASELINES[name]
    env = {"BENCH_WEIGHTS": str(weights.path), "BENCH_SIZE": str(plan.service_size)}
    with servers.baseline(name, module, threads, env, log_dir) as server:
        url = f"{server.url}/convert"
        warm_up = convert(url, data, timeout=600, retry=False)
        runs = load_runs(server, url, data, plan.baseline_levels, plan.per_client)
    return {"label": label, "command": f"gunicorn --workers 1 --threads {threads} bench.{module}:app",
            "startup_s": server.startup_s,
            "first_request": {"status": warm_up.status, "seconds": warm_up.seconds}, "runs": runs}


def measure_overload(weights: Weights, data: bytes, plan: Plan, log_dir: Path) -> dict[str, Any]:
    """More clients at once than ours admits: who gets 200, who gets a (prompt) 503."""
    # threads: gunicorn.conf.py's default for this queue (a thread for every conversion
    # admitted and every upload arriving, and one for /healthz)
    settings = {"ANIMEGAN_MAX_QUEUE": str(plan.overload_queue)}
    with servers.ours("ours-overload", ours_env(weights, **settings), log_dir) as server:
        url = f"{server.url}/animegan/convert?size={plan.service_size}"
        convert(url, data, timeout=600, retry=False)  # warm-up for this shape
        run = run_clients(url, data, clients=plan.overload_clients, per_client=1, retry=False)
        in_flight_after = server.health()["in_flight"]
    slowest = run["max_attempt_s_by_status"]
    return {"settings": settings, "clients": plan.overload_clients,
            "status_200": run["statuses"].get("200", 0), "status_503": run["statuses"].get("503", 0),
            "statuses": run["statuses"], "max_503_s": slowest.get("503"),
            "max_200_s": slowest.get("200"), "in_flight_after": in_flight_after}


def run_at(server: dict[str, Any], clients: int) -> dict[str, Any] | None:
    """The load run of ``server`` with ``clients`` clients, if there was one."""
    return next((r for r in server.get("runs", ()) if r["clients"] == clients), None)


def ratios(result: dict[str, Any], top: int, model_s: float | None,
           photo_inference_s: float | None) -> dict[str, Any]:
    """The comparisons the targets are about, at ``top`` concurrent clients."""
    ours = result["servers"]["ours"]
    ours_top, ours_one = run_at(ours, top), run_at(ours, 1)
    throughput = ours_top["throughput_per_s"] if ours_top else None
    single = ours_one["latency_s"]["p50"] if ours_one else None
    found: dict[str, Any] = {"clients": top}
    for name in BASELINES:
        other = run_at(result["servers"].get(name, {}), top)
        found[f"throughput_vs_{name}"] = ratio(throughput, other and other["throughput_per_s"])
    torch_top = run_at(result["servers"].get("ours-torch", {}), top)
    found["throughput_vs_ours_torch"] = ratio(throughput, torch_top and torch_top["throughput_per_s"])
    found["throughput_x_model_s"] = throughput * model_s if throughput and model_s else None
    found["throughput_x_photo_inference_s"] = (throughput * photo_inference_s
                                               if throughput and photo_inference_s else None)
    found["single_latency_s"] = single
    found["first_vs_steady"] = ratio(ours["first_request"]["seconds"], single)
    found["cpu_per_image_top_vs_single"] = ratio(ours_top and ours_top["cpu_s_per_image"],
                                                 ours_one and ours_one["cpu_s_per_image"])
    overload = result.get("overload", {})
    queue = int(overload.get("settings", {}).get("ANIMEGAN_MAX_QUEUE", 0))
    found["overload_max_503_vs_single"] = ratio(overload.get("max_503_s"), single)
    found["overload_max_200_vs_queue_bound"] = ratio(overload.get("max_200_s"),
                                                     single and (1 + queue) * single)
    return found
