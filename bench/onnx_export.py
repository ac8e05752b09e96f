"""The ONNX export against the server's own backends, in one run on one machine.

For the shipped style and a seeded random weights file: the export's PSNR against torch
fp32 at 256 and 512 px (a real photo), its file size; then the time per 512-px image of
onnxruntime (CPU) next to the engine with ANIMEGAN_BACKEND=auto and with torch fp32, the
modes interleaved round by round, medians. ``python -m bench.onnx_export [--runs 7]``
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from flask_animegan.config import Settings
from flask_animegan.runtime.engine import InferenceEngine
from flask_animegan.runtime.generator import Generator
from flask_animegan.runtime.onnx_export import export_onnx, psnr_db
from flask_animegan.runtime.weights import load_generator

from .inputs import photo, prepare_weights
from .timing import median


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def as_batch(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image.convert("RGB"), dtype=np.float32).transpose(2, 0, 1)[None]
    return torch.from_numpy(np.ascontiguousarray(array / 127.5 - 1))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7, help="timed rounds (median of them)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    import onnxruntime

    threads = torch.get_num_threads()
    work = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    shipped = prepare_weights(work / "models")
    torch.manual_seed(0)
    torch.save(Generator().state_dict(), work / "models" / "random_style.pt")
    engine = InferenceEngine.from_settings(work / "models", Settings(
        default_style=shipped.style, backend="auto", precision="auto",
        model_cache_dir=str(work / "cache"), shipped_styles=False))
    reference = InferenceEngine.from_settings(work / "models", Settings(
        default_style=shipped.style, backend="torch", precision="fp32", shipped_styles=False))

    results: dict[str, Any] = {"cpu": cpu_model(), "threads": threads, "runs": args.runs,
                               "torch": torch.__version__,
                               "onnxruntime": onnxruntime.__version__, "styles": {}}
    sessions = {}
    for name in (shipped.style, "random_style"):
        style = engine.style(name)
        assert style.path is not None
        network = load_generator(style.path)
        target = work / f"{name}.onnx"
        started = time.perf_counter()
        card = export_onnx(network, style, target)
        seconds = time.perf_counter() - started
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(str(target), options,
                                               providers=["CPUExecutionProvider"])
        sessions[name] = session
        psnr = {}
        for side in (256, 512):
            batch = as_batch(photo().resize((side, side), Image.Resampling.LANCZOS))
            with torch.inference_mode():
                expected = network(batch)
            (got,) = session.run(None, {"image": batch.numpy()})
            psnr[side] = round(psnr_db(expected, torch.from_numpy(got)), 1)
        results["styles"][name] = {"psnr_db": psnr, "mib": round(card["bytes"] / 2**20, 2),
                                   "opset": card["opset"], "export_s": round(seconds, 1)}

    pixels = np.array(photo().resize((512, 512), Image.Resampling.LANCZOS).convert("RGB"))
    engine.prepare(256)  # settles `auto` as a server's warm-up does
    auto, torch_fp32 = engine.runner(shipped.style), reference.runner(shipped.style)
    session = sessions[shipped.style]

    def onnx_run() -> object:
        batch = pixels.astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1
        return session.run(None, {"image": np.ascontiguousarray(batch)})[0]

    modes = {f"server auto ({InferenceEngine.serving(engine.pool.get(engine.style(None)))})":
             lambda: auto(pixels),
             "torch fp32": lambda: torch_fp32(pixels),
             f"onnxruntime {onnxruntime.__version__} CPU": onnx_run}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for run in modes.values():
        run()  # one warm-up each
    for _ in range(args.runs):  # interleaved: a slow moment of a shared machine hits all
        for mode, run in modes.items():
            began = time.perf_counter()
            run()
            seconds[mode].append(time.perf_counter() - began)
    base = median(seconds["torch fp32"]) or 1.0
    results["seconds_512"] = {mode: {"median": round(median(values) or 0, 3),
                                     "vs_torch_fp32": round((median(values) or 0) / base, 2)}
                              for mode, values in seconds.items()}

    print(f"CPU: {results['cpu']} ({threads} threads); torch {torch.__version__}, "
          f"onnxruntime {onnxruntime.__version__}; {args.runs} rounds, medians")
    print("\n| style | PSNR 256 px | PSNR 512 px | file | opset |\n| --- | --- | --- | --- | --- |")
    for name, row in results["styles"].items():
        print(f"| {name} | {row['psnr_db'][256]} dB | {row['psnr_db'][512]} dB | "
              f"{row['mib']} MiB | {row['opset']} |")
    print("\n| 512x512 px, one image | median s | vs torch fp32 |\n| --- | --- | --- |")
    for mode, row in results["seconds_512"].items():
        print(f"| {mode} | {row['median']} | {row['vs_torch_fp32']} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
