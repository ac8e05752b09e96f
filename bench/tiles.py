"""Large photos in tiles: PSNR of tiled against untiled, and a 4096-px conversion's peak
worker memory under gunicorn. ``python -m bench.tiles [--sizes ...] [--memory 4096]``;
not part of ``python -m bench`` (the untiled reference alone is slow and large).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests
import skimage.data
import torch
from PIL import Image

from flask_animegan.runtime import tiles
from flask_animegan.runtime.backends import to_pixels
from flask_animegan.runtime.backends.torch import to_batch
from flask_animegan.runtime.weights import load_generator

from . import servers
from .inputs import prepare_weights
from .service import ours_env

PHOTOS = ("astronaut", "coffee")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else round(10 * float(np.log10(255 ** 2 / mse)), 2)


def photo_at(name: str, side: int) -> np.ndarray:
    image = Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB")
    scale = side / max(image.size)
    size = (round(image.width * scale), round(image.height * scale))
    return np.asarray(image.resize(size, Image.Resampling.LANCZOS)).copy()


def fidelity(weights_path: Path, sizes: list[int]) -> list[dict[str, Any]]:
    network = load_generator(weights_path).eval()
    rows = []
    for side in sizes:
        for name in PHOTOS if side <= 1024 else PHOTOS[:1]:
            pixels = photo_at(name, side)
            started = time.perf_counter()
            with torch.inference_mode():
                batch = to_batch(np.array(pixels), torch.float32)
                out = network(batch)[0].permute(1, 2, 0).numpy()
            whole = to_pixels(out)
            whole_s = time.perf_counter() - started
            del out
            assert whole is not None
            row: dict[str, Any] = {"photo": name, "size": list(pixels.shape[1::-1]),
                                   "whole_s": round(whole_s, 1)}
            for label, stats_side in (("default", tiles.STATS_SIDE), ("stats_768", 768),
                                      ("own_stats", side)):
                if label == "own_stats" and side > 1024:
                    continue  # a whole pass at this size: the memory tiles avoid
                started = time.perf_counter()
                tiled = tiles.run_tiled(network, pixels, stats_side=stats_side)
                assert tiled is not None
                row[f"{label}_db"] = psnr(tiled, whole)
                row[f"{label}_s"] = round(time.perf_counter() - started, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def memory(side: int, log_dir: Path, **settings: str) -> dict[str, Any]:
    weights = prepare_weights(log_dir / "models")
    env = ours_env(weights, ANIMEGAN_MAX_OUTPUT_SIDE=str(side), **settings)
    image = Image.fromarray(photo_at("astronaut", 1024)).resize((side, side),
                                                              Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    with servers.ours("ours-tiles", env, log_dir) as server, requests.Session() as session:
        at_start = server.worker_memory_mib()
        # reset VmHWM so the peak from here on is the conversion's alone
        Path(f"/proc/{server.worker_pid()}/clear_refs").write_text("5")
        before = server.worker_memory_mib()
        started = time.perf_counter()
        response = session.post(f"{server.url}/animegan/convert?size={side}&format=jpeg",
                                data=data, headers={"Content-Type": "image/jpeg"},
                                timeout=1800)
        seconds = time.perf_counter() - started
        after = server.worker_memory_mib()
        size = (Image.open(io.BytesIO(response.content)).size
                if response.status_code == 200 else None)
        health = server.health()
    result = {"side": side, "upload_bytes": len(data), "status": response.status_code,
              "output_size": size, "seconds": round(seconds, 1),
              "peak_of_start_mib": at_start["VmHWM"], "rss_before_mib": before["VmRSS"],
              "peak_after_mib": after["VmHWM"], "rss_after_mib": after["VmRSS"],
              "backend": health.get("backend"), "precision": health.get("precision")}
    print(json.dumps(result), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048",
                        help="output sizes of the fidelity rows ('' for none)")
    parser.add_argument("--memory", type=int, default=4096,
                        help="output size of the memory run (0 for none)")
    parser.add_argument("--precision", default="",
                        help="ANIMEGAN_PRECISION of the memory run's server (default: auto)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tiles-") as folder:
        weights = prepare_weights(Path(folder) / "weights")
        print(f"weights: {weights.source}", flush=True)
        if args.memory:
            extra = {"ANIMEGAN_PRECISION": args.precision} if args.precision else {}
            report["memory"] = memory(args.memory, Path(folder), **extra)
        sizes = [int(s) for s in args.sizes.split(",") if s]
        if sizes:
            report["fidelity"] = fidelity(weights.path, sizes)
    report["bench_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
