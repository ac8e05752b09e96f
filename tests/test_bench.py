"""The benchmark (``flask animegan bench``, i.e. ``python -m bench``) runs end to end in its
quick mode.

Only that it runs and reports every section is tested; its timings are never
asserted (they depend on the machine and on what else it is doing).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, need

pytestmark = [pytest.mark.bench, pytest.mark.server]

SECTIONS = ("machine", "weights", "ceilings", "model", "stages", "service", "cache", "memory",
            "jobs", "colors", "targets")


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_quick_bench_reports_every_section_and_both_baselines_answer(tmp_path):
    need(importlib.util.find_spec("torchvision") is not None,
         "the bench's baselines need torchvision: pip install -e '.[bench]'")
    out = tmp_path / "b.json"
    # through the CLI (`flask animegan bench`), which runs `python -m bench`
    flask = Path(sys.executable).with_name("flask")
    done = subprocess.run([str(flask), "--app", "example_app", "animegan", "bench", "--quick",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=420, env={**os.environ, "ANIMEGAN_SAMPLE_SIZE": "0"})
    assert done.returncode == 0, f"bench failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert "## Targets" in done.stdout

    results = json.loads(out.read_text())
    for section in SECTIONS:
        assert section in results and "error" not in results[section], section
    assert results["errors"] == []
    assert {row["mode"] for row in results["model"]["results"]} >= {"fp32-nchw", "fp32"}
    for row in results["model"]["results"]:
        assert positive(row["gflops"]) and positive(row["speedup_vs_fp32_nchw"])

    ratios = results["service"]["ratios"]
    for key in ("throughput_vs_original", "throughput_vs_optimized", "throughput_x_model_s",
                "first_vs_steady", "cpu_per_image_top_vs_single"):
        assert positive(ratios[key]), (key, ratios[key])
    assert positive(results["cache"]["times"]["near_hit_vs_miss"])
    assert results["cache"]["times"]["confirmed"]["near hit"] >= 1
    assert results["cache"]["other_client_hits"] == 0
    assert positive(results["stages"]["non_inference_share"])
    assert results["memory"]["small_statuses"] == {"200": results["memory"]["warmup_requests"]
                                                   + results["memory"]["requests"]}

    jobs = results["jobs"]
    assert positive(jobs["throughput"]["job_vs_photo"])
    assert jobs["saving"]["converted"] < jobs["saving"]["frames"]
    assert jobs["saving"]["converted_without"] == jobs["saving"]["frames"]
    assert jobs["memory"]["frames"] == 250 and len(jobs["memory"]["samples"]) >= 5

    servers = results["service"]["servers"]
    for name in ("ours", "original", "optimized"):
        answered = sum(run["statuses"].get("200", 0) for run in servers[name]["runs"])
        assert answered >= 1, f"{name} never answered 200: {servers[name]['runs']}"
    overload = results["service"]["overload"]
    assert overload["status_200"] >= 1
    assert overload["status_200"] + overload["status_503"] == overload["clients"]
    assert all(t["measured"] is None or isinstance(t["measured"], (int, float))
               for t in results["targets"])
