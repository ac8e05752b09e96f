"""Each backend's start (cold and warm model cache), first conversion and memory.

Every row is a fresh process; OpenVINO modes start twice on one cache folder, the second
must find everything cached. ``python -m bench.backends [--size 512] [--runs 3]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .inputs import REPO, prepare_weights
from .timing import median, ratio

CHILD = "bench.backends"


def rss_mib() -> dict[str, float]:
    """This process's VmRSS and VmHWM (peak), in MiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def child(mode: str, cache: str, models_dir: str, style: str, size: int, runs: int,
          threads: int) -> dict[str, Any]:
    """In a fresh process: prepare, ``runs`` + 1 conversions, then the memory once idle."""
    started = time.perf_counter()
    import numpy as np
    from PIL import Image

    from flask_animegan.process import configure_process
    from flask_animegan.runtime.engine import IDLE_RELEASE_S

    from .model_speed import engine_for

    configure_process(threads)
    imported = time.perf_counter()
    engine = engine_for(mode, Path(models_dir), style, Path(cache))
    engine.prepare(256)
    ready = time.perf_counter()
    at_ready = rss_mib()
    picture = Image.fromarray(
        np.random.default_rng(size).integers(0, 256, (size, size, 3), dtype=np.uint8))
    seconds = []
    for _ in range(runs + 1):
        began = time.perf_counter()
        engine.run(picture, style)
        seconds.append(time.perf_counter() - began)
    served = rss_mib()
    time.sleep(IDLE_RELEASE_S + 1)  # OpenVINO gives its buffers back when idle
    status = engine.status()
    return {
        "mode": mode, "serving": status["styles_backend"].get(style),
        "import_s": imported - started, "prepare_s": ready - imported,
        "first_s": seconds[0], "steady_s": median(seconds[1:]),
        "rss_ready_mib": at_ready["VmRSS"], "rss_served_mib": served["VmRSS"],
        "rss_idle_mib": rss_mib()["VmRSS"], "peak_mib": served["VmHWM"],
        "openvino": status.get("openvino", {}).get("loads"),
    }


def start(mode: str, cache: Path, weights: Any, size: int, runs: int,
          threads: int) -> dict[str, Any]:
    """One fresh process of ``mode``; its figures, with the wall time from spawn to exit."""
    argv = [sys.executable, "-m", CHILD, "--child", mode, str(cache), str(weights.models_dir),
            weights.style, str(size), str(runs), str(threads)]
    began = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - began
    return result


def measure(weights: Any, modes: list[str], *, size: int, runs: int, threads: int,
            workdir: Path) -> dict[str, Any]:
    """Per mode: a start on an empty cache, then one on the filled cache (OpenVINO)."""
    rows: list[dict[str, Any]] = []
    caches = {mode: workdir / f"cache-{mode}" for mode in modes}
    for phase in ("cold", "warm"):
        for mode in modes:
            if phase == "warm" and not mode.startswith("openvino"):
                continue  # torch has nothing to cache
            row = start(mode, caches[mode], weights, size, runs, threads)
            row["start"] = phase if mode.startswith("openvino") else "-"
            rows.append(row)
    torch_row = next((r for r in rows if r["mode"] == "fp32"), None)
    for row in rows:
        row["first_vs_steady"] = ratio(row["first_s"], row["steady_s"])
        for key in ("rss_ready_mib", "rss_served_mib", "rss_idle_mib", "peak_mib"):
            row[f"{key[:-4]}_vs_torch"] = ratio(row[key], torch_row and torch_row[key])
        row["steady_vs_torch_fp32"] = ratio(row["steady_s"], torch_row and torch_row["steady_s"])
    return {"size": size, "runs": runs, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backends")
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.child:
        mode, cache, models_dir, style, size, runs, threads = args.child
        print(json.dumps(child(mode, cache, models_dir, style, int(size), int(runs),
                               int(threads))))
        return 0
    from flask_animegan.runtime.precision import native_bf16

    from . import report
    from .ceilings import usable_cpus
    from .model_speed import modes

    with tempfile.TemporaryDirectory(prefix="animegan-bench-") as tmp:
        weights = prepare_weights(Path(tmp) / "models")
        result = measure(weights, [m for m in modes(native_bf16()) if m != "fp32-nchw"],
                         size=args.size, runs=args.runs, threads=usable_cpus(), workdir=Path(tmp))
    print(report.backends({"backends": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
