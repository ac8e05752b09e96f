"""Run the benchmark: ``python -m bench [--quick] [--out PATH]``.

Prints a markdown report and writes every figure as JSON; a failed section is recorded
and the others still run (exit status 1). Missed targets never fail the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask_animegan.config import Settings
from flask_animegan.process import configure_process
from flask_animegan.runtime.engine import InferenceEngine

from . import (
    backends,
    cache_rule,
    ceilings,
    colors,
    jobs,
    memory,
    model_speed,
    portrait,
    report,
    service,
    stages,
    targets,
)
from .inputs import PHOTO_DESCRIPTION, REPO, jpeg, photo, prepare_weights
from .plan import FULL, QUICK, Plan

DEFAULT_OUT = REPO / "bench" / "results" / "latest.json"


def log(message: str) -> None:
    """Progress on stderr, so stdout holds only the report."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_section(name: str, measure: Callable[[], dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    """Run one section; on failure record the error (and go on with the others)."""
    log(f"{name} ...")
    started = time.monotonic()
    try:
        result = measure()
    except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others
        errors.append(name)
        log(f"{name} FAILED:\n{traceback.format_exc()}")
        return {"error": f"{exc.__class__.__name__}: {exc}"}
    log(f"{name} done in {time.monotonic() - started:.1f} s")
    return result


def run(plan: Plan, quick: bool, workdir: Path) -> tuple[dict[str, Any], list[str]]:
    """Measure every section with ``plan``; return the results and the failed sections."""
    started = time.monotonic()
    errors: list[str] = []
    configure_process(ceilings.usable_cpus())
    machine = ceilings.machine_info()
    bf16 = machine["native_bf16"]
    weights = prepare_weights(workdir / "models")
    # what `auto` settles on here, as at the app's start (filling the servers' model cache)
    model_cache = workdir / "model-cache"
    probe = InferenceEngine.from_settings(
        weights.models_dir, Settings(default_style=weights.style, precision="auto",
                                     backend="auto", model_cache_dir=str(model_cache)))
    probe.prepare(256)
    precision, backend = probe.precision, probe.backend
    machine["precision_auto"] = precision
    machine["backend_auto"] = backend
    machine["precision_timings_256px"] = probe.precision_timings
    machine["backend_timings_256px"] = probe.timings
    machine["backends_refused"] = probe.rejected
    mode = model_speed.mode_of(backend, precision)
    del probe
    image = photo()
    data = jpeg(image)
    results: dict[str, Any] = {
        "quick": quick,
        "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "weights": {"source": weights.source, "style": weights.style, "file": weights.path.name,
                    "shipped": weights.style == "toon_demo"},
        "photo": {"description": PHOTO_DESCRIPTION, "bytes": len(data)},
        "plan": dataclasses.asdict(plan),
    }
    results["ceilings"] = run_section(
        "ceilings", lambda: ceilings.measure(plan.matmul_n, plan.matmul_runs, bf16), errors)
    ceiling = results["ceilings"] if "error" not in results["ceilings"] else {
        "fp32_gflops": None, "bf16_gflops": None}
    results["model"] = run_section("model compute", lambda: model_speed.measure(
        list(plan.model_sizes), plan.model_repeats, models_dir=weights.models_dir,
        style=weights.style, weights=weights.path, ceilings=ceiling, bf16=bf16), errors)
    results["stages"] = run_section("stages", lambda: stages.measure(
        data, size=plan.stage_size, runs=plan.stage_runs, models_dir=weights.models_dir,
        style=weights.style, precision=precision, backend=backend), errors)
    results["cache"] = run_section("cache", lambda: cache_rule.measure(
        quick, weights.models_dir, weights.style), errors)

    logs = workdir / "logs"
    logs.mkdir()
    servers: dict[str, Any] = {}
    servers["ours"] = run_section("service: ours", lambda: service.measure_ours(
        weights, data, plan, logs), errors)
    backend_served = servers["ours"].get("backend", "torch")
    if plan.service_torch_too and backend_served != "torch":
        # the same server forced onto torch, for the backends' service comparison
        servers["ours-torch"] = run_section("service: ours on torch", lambda: (
            service.measure_ours(weights, data, plan, logs, backend="torch")), errors)
    for name in service.BASELINES:
        servers[name] = run_section(f"service: baseline {name}", lambda name=name: (
            service.measure_baseline(name, weights, data, plan, logs)), errors)
    overload = run_section("service: overload", lambda: service.measure_overload(
        weights, data, plan, logs), errors)
    results["service"] = {"size": plan.service_size, "servers": servers, "overload": overload}
    if "error" not in servers["ours"]:
        model_s = (model_speed.seconds_for(results["model"], plan.service_size, mode)
                   if "error" not in results["model"] else None)
        inference_ms = results["stages"].get("stages_ms", {}).get("inference")
        results["service"]["ratios"] = service.ratios(
            results["service"], max(plan.client_levels), model_s,
            inference_ms / 1000 if inference_ms else None)
        results["service"]["ratios"]["model_mode"] = mode

    results["memory"] = run_section("memory", lambda: memory.measure(
        weights, data, plan, logs), errors)
    results["backends"] = run_section("backends", lambda: backends.measure(
        weights, [m for m in model_speed.modes(bf16) if m != model_speed.REFERENCE_MODE],
        size=plan.backend_size, runs=plan.backend_runs, threads=ceilings.usable_cpus(),
        workdir=workdir), errors)
    results["jobs"] = run_section("jobs", lambda: jobs.measure(
        weights.models_dir, weights.style, quick=quick, backend=backend,
        precision=precision), errors)
    results["colors"] = run_section("colors", lambda: colors.measure(
        weights.path, quick=quick), errors)
    results["portrait"] = run_section("portrait", lambda: portrait.measure(quick), errors)
    results["targets"] = targets.check(results)
    results["errors"] = errors
    results["duration_s"] = time.monotonic() - started
    return results, errors


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run, print the report, write the JSON; 1 if a section failed."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run with tiny sizes and few requests (about a minute)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where to write the JSON (default: {DEFAULT_OUT.relative_to(REPO)})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="animegan-bench-") as workdir:
        results, errors = run(QUICK if args.quick else FULL, args.quick, Path(workdir))
    print(report.render(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {args.out}")
    if errors:
        log(f"sections that failed: {', '.join(errors)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
