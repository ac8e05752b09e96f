"""A long video through a real job worker: its memory, sampled each second, and its speed.

``python -m bench.long_video [--minutes 5] [--size 256] [--quick]`` starts a redis-server
and one ``flask animegan worker`` (the example app, its shipped style, ``auto`` backend),
sends it a generated clip (a pan over a photo, with an AAC tone) of ``--minutes`` at 25 fps
and prints the worker's RSS curve as the frames go, then a Markdown summary: the RSS after
the first minute of conversion and at the end (flat: within 5 %), frames per second, and
the total (docs/benchmark.md, "A long video in flat memory"). Needs redis-server.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from bench.ceilings import cpu_model
from bench.jobs import Motion, motion_frames
from bench.servers import REPO, RedisServer, proc_status_kib

FPS = 25
CLIP_SIZE = (320, 180)
SAMPLE_EVERY = 1.0


def long_clip(seconds: float, size: tuple[int, int] = CLIP_SIZE, fps: int = FPS) -> bytes:
    """An MP4 of ``seconds``: H.264 (a slow pan, x264 ultrafast) and a mono AAC tone,
    written to a temporary file as it goes (a five-minute clip is never a list of frames)."""
    count = round(seconds * fps)
    with tempfile.TemporaryFile() as file:
        with av.open(file, "w", format="mp4") as out:
            video = out.add_stream("libx264", rate=fps)
            video.width, video.height = size
            video.pix_fmt = "yuv420p"
            video.codec_context.time_base = Fraction(1, fps)
            video.options = {"preset": "ultrafast", "crf": "26"}
            video.thread_count = 1
            audio = out.add_stream("aac", rate=48_000, layout="mono")
            samples = audio.codec_context.frame_size or 1024
            step, sent = 0, 0
            for index, image in enumerate(motion_frames(Motion("pan", 0.5), count, size)):
                frame = av.VideoFrame.from_image(image)
                frame.pts, frame.time_base = index, video.codec_context.time_base
                out.mux(video.encode(frame))
                while sent < (index + 1) / fps * 48_000:  # the tone keeps up with the frames
                    times = (np.arange(samples) + step * samples) / 48_000
                    tone = (0.3 * np.sin(2 * math.pi * 440 * times)).astype(np.float32)
                    chunk = av.AudioFrame.from_ndarray(tone[None, :], format="fltp",
                                                       layout="mono")
                    chunk.sample_rate, chunk.pts = 48_000, step * samples
                    out.mux(audio.encode(chunk))
                    step, sent = step + 1, sent + samples
            out.mux(video.encode(None))
            out.mux(audio.encode(None))
        file.seek(0)
        return file.read()


def worker_env(redis_uri: str, minutes: float) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANIMEGAN_")}
    env.update({"PYTHONPATH": str(REPO), "FLASK_SECRET_KEY": "bench-long-video",
                "ANIMEGAN_STORAGE_URI": redis_uri, "ANIMEGAN_SAMPLE_SIZE": "0",
                "ANIMEGAN_MAX_SECONDS": str(max(300, 60 * minutes + 5)),
                "ANIMEGAN_MAX_FRAMES": str(max(18000, round(60 * minutes * FPS) + 100)),
                "ANIMEGAN_RATE_LIMIT": ""})
    return env


def measure(minutes: float, size: int, folder: Path) -> dict[str, Any]:
    """Convert a ``minutes`` clip at ``size`` on one worker: RSS samples and speed."""
    from flask import Flask

    from flask_animegan import AnimeGAN
    from flask_animegan.config import from_environ

    started = time.monotonic()
    clip = long_clip(60 * minutes)
    made = time.monotonic() - started
    with RedisServer(folder / "redis", maxmemory="1gb") as redis:
        env = worker_env(redis.uri, minutes)
        app = Flask("bench_long_video")
        app.config.update(from_environ(env), SECRET_KEY="bench-long-video")
        AnimeGAN(app)
        service = app.extensions["animegan"]
        with (folder / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", "example_app", "animegan", "worker",
                 "--name", "bench"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            info = service.jobs.probe(clip)
            record = service.jobs.submit(clip, info, style=service.engine.style(None).name,
                                         size=size, client="127.0.0.1")
            samples: list[dict[str, float]] = []
            first_frame: float | None = None
            while not (current := service.jobs.store.get(record.id)).finished:
                now = time.monotonic()
                if current.frames_done and first_frame is None:
                    first_frame = now
                samples.append({"t": round(now - (first_frame or now), 1),
                                "frames": current.frames_done,
                                "rss_mib": round(proc_status_kib(worker.pid, "VmRSS") / 1024, 1)})
                if worker.poll() is not None:
                    raise RuntimeError(f"the worker died: {(folder / 'worker.log').read_text()}")
                time.sleep(SAMPLE_EVERY)
            done = time.monotonic()
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    if current.state.value != "done":
        raise RuntimeError(f"the job ended {current.state.value}: {current.error}")
    converting = [s for s in samples if s["frames"]]
    after_minute = next((s for s in converting if s["t"] >= 60), converting[0])
    last = converting[-1]
    seconds = done - (first_frame or done)
    return {"minutes": minutes, "size": size, "frames": current.frames_total,
            "clip_mib": round(len(clip) / 2**20, 1), "clip_made_s": round(made, 1),
            "convert_s": round(seconds, 1),
            "fps": round(current.frames_total / seconds, 1) if seconds else None,
            "rss_after_minute_mib": after_minute["rss_mib"], "rss_last_mib": last["rss_mib"],
            "rss_max_mib": max(s["rss_mib"] for s in converting),
            "growth": round(last["rss_mib"] / after_minute["rss_mib"] - 1, 4),
            "segments": current.segments_done, "samples": samples,
            "cpu": cpu_model()}


def render(result: dict[str, Any]) -> str:
    """The summary and the RSS curve (one row per 10 % of the frames) as Markdown."""
    lines = [f"{result['minutes']:g}-minute clip ({result['frames']} frames at {FPS} fps, "
             f"{CLIP_SIZE[0]}x{CLIP_SIZE[1]}, AAC) at {result['size']} px on {result['cpu']}: "
             f"{result['fps']} frames/s, {result['convert_s']} s; worker RSS "
             f"{result['rss_after_minute_mib']} MiB after the first minute, "
             f"{result['rss_last_mib']} MiB at the last sample ({result['growth']:+.1%}), "
             f"{result['rss_max_mib']} MiB at most.", "",
             "| seconds | frames | worker RSS (MiB) |", "|---|---|---|"]
    converting = [s for s in result["samples"] if s["frames"]]
    step = max(1, len(converting) // 10)
    shown = converting[::step]
    for sample in shown + ([converting[-1]] if shown[-1] is not converting[-1] else []):
        lines.append(f"| {sample['t']:g} | {sample['frames']} | {sample['rss_mib']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="a 20-second clip at 96 px")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    minutes, size = (1 / 3, 96) if args.quick else (args.minutes, args.size)
    with tempfile.TemporaryDirectory(prefix="bench-long-video-") as folder:
        result = measure(minutes, size, Path(folder))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
