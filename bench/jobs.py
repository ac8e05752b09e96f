"""Jobs (animations and videos) against the photo path, and the repeat rule.

``python -m bench.jobs [--quick]``: the rule's reuse share on generated H.264 clips, a job's
frames per second against the photo path's, the saving on a half-held clip and the worker's
memory (docs/benchmark.md). Imports only ``flask_animegan``: the tests use its clip maker.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import skimage.data
from PIL import Image

from flask_animegan.inputs import media
from flask_animegan.inputs.decoding import DecodeLimits
from flask_animegan.convert import repeats

FPS = 25
BOX_SHARE = 0.05  # of the picture's area
KINDS = ("static", "pan", "zoom", "box", "fade")
#: What each kind's speed means.
UNITS = {"static": "", "pan": "px/frame", "zoom": "%/frame", "box": "px/frame",
         "fade": "s to black"}


@dataclass(frozen=True)
class Motion:
    """One generated clip: a kind of movement at a speed, encoded at a crf."""

    kind: str
    speed: float = 0.0
    crf: int = 23

    @property
    def label(self) -> str:
        """'pan 0.5 px/frame crf 23'."""
        speed = f" {self.speed:g} {UNITS[self.kind]}" if self.kind != "static" else ""
        return f"{self.kind}{speed} crf {self.crf}"


#: Must be reused (>= 90 % of their frames): held shots, as encoders really make them.
HELD = tuple(Motion("static", crf=crf) for crf in (18, 23, 28))
#: Must be converted (at most 10 % reused): visible movement, slow ones included.
MOVING = (tuple(Motion("pan", speed) for speed in (0.5, 1, 2, 4))
          + tuple(Motion("zoom", speed) for speed in (0.5, 1, 2))
          + tuple(Motion("box", speed) for speed in (1, 2, 4))
          + tuple(Motion("fade", speed) for speed in (1, 2, 4))
          + (Motion("pan", 0.5, 28), Motion("box", 1, 28), Motion("fade", 2, 28)))
#: Reported, not asked: beyond x264's usual range, or too slow to see frame to frame.
OUTSIDE = (Motion("static", crf=33), Motion("pan", 0.25), Motion("zoom", 0.1),
           Motion("zoom", 0.25), Motion("fade", 8), Motion("fade", 4, 28))
PHOTOS = ("chelsea", "astronaut", "coffee", "camera")
QUICK_PHOTOS = ("chelsea", "camera")


def photo(name: str) -> Image.Image:
    """A photograph from scikit-image's wheel, as RGB."""
    return Image.fromarray(np.asarray(getattr(skimage.data, name)())).convert("RGB")


def _triangle(position: float, span: float) -> float:
    """``position`` folded into [0, span]: back and forth, so a clip can be any length."""
    if span <= 0:
        return 0.0
    period = position % (2 * span)
    return period if period <= span else 2 * span - period


def _view(source: Image.Image, size: tuple[int, int], left: float, top: float,
          height: float) -> Image.Image:
    width = height * size[0] / size[1]
    return source.resize(size, Image.Resampling.BILINEAR,
                         box=(left, top, left + width, top + height))


def motion_frames(motion: Motion, count: int, size: tuple[int, int] = (192, 128),
                  name: str = "chelsea") -> Iterator[Image.Image]:
    """``count`` RGB frames of ``size`` moving as ``motion`` says, over photo ``name``."""
    source = photo(name)
    width, height = size
    view = source.height * 0.4  # of the photo's height, so a pan has room
    view = min(view, source.width * 0.4 * height / width)
    scale = view / height  # photo pixels per frame pixel
    room_x = source.width - view * width / height
    centre_top = (source.height - view) / 2
    background = _view(source, size, room_x / 2, centre_top, view)
    patch_size = (round(width * math.sqrt(BOX_SHARE)), round(height * math.sqrt(BOX_SHARE)))
    patch = photo("astronaut").resize(patch_size, Image.Resampling.BILINEAR,
                                      box=(180, 60, 340, 200))
    for index in range(count):
        if motion.kind == "static":
            yield background.copy()
        elif motion.kind == "pan":
            left = _triangle(index * motion.speed * scale, room_x)
            yield _view(source, size, left, centre_top, view)
        elif motion.kind == "zoom":  # in, then out again
            steps = _triangle(index, math.log(0.6) / math.log(1 - motion.speed / 100))
            shown = 1.5 * view * (1 - motion.speed / 100) ** steps  # to 60 % of it and back
            shown_width = shown * width / height
            yield _view(source, size, (source.width - shown_width) / 2,
                        (source.height - shown) / 2, shown)
        elif motion.kind == "box":
            frame = background.copy()
            left = round(_triangle(index * motion.speed, width - patch_size[0]))
            frame.paste(patch, (left, (height - patch_size[1]) // 2))
            yield frame
        elif motion.kind == "fade":  # towards black at 1/speed a second, 80 % of the way, and back
            light = 1 - _triangle(index, 0.8 * motion.speed * FPS) / (motion.speed * FPS)
            yield Image.fromarray(np.rint(np.asarray(background, np.float32) * light)
                                  .astype(np.uint8))
        else:
            raise ValueError(f"no such motion: {motion.kind}")


def encode_clip(frames: Iterator[Image.Image], size: tuple[int, int], crf: int = 23,
                fps: int = FPS) -> bytes:
    """An MP4 (H.264, yuv420p, x264 at ``crf``; no audio) of ``frames``."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, fps)
        stream.options = {"preset": "ultrafast", "crf": str(crf)}
        stream.thread_count = 1
        for index, image in enumerate(frames):
            frame = av.VideoFrame.from_image(image)
            frame.pts = index
            frame.time_base = stream.codec_context.time_base
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def motion_clip(motion: Motion, count: int = 40, size: tuple[int, int] = (192, 128),
                name: str = "chelsea") -> bytes:
    """The MP4 of :func:`motion_frames`."""
    return encode_clip(motion_frames(motion, count, size, name), size, motion.crf)


def decoded(data: bytes, size: int) -> list[Image.Image]:
    """The clip's frames as a job sees them: decoded and fitted to ``size``."""
    limits, decode = media.MediaLimits(), DecodeLimits()
    info = media.probe(data, limits, decode)
    return [frame.image for frame in media.frames(data, info, limits, decode, size=size)]


@dataclass
class RuleRun:
    """What the rule did over one clip's frames."""

    frames: int
    reused: int
    worst_shift: float  # over the frames reused, against their converted frame
    worst_block: float
    worst_bits: int

    @property
    def share(self) -> float:
        """Frames reused / frames after the first."""
        return self.reused / max(1, self.frames - 1)


def apply_rule(images: list[Image.Image]) -> RuleRun:
    """Run the rule over ``images`` as Jobs.run does (against the last converted frame)."""
    anchor: repeats.Picture | None = None
    run = RuleRun(len(images), 0, 0.0, 0.0, 0)
    for image in images:
        picture = repeats.Picture.of(image)
        measured = repeats.difference(picture, anchor) if anchor is not None else None
        if measured is not None and measured.repeat:
            run.reused += 1
            run.worst_shift = max(run.worst_shift, measured.shift)
            run.worst_block = max(run.worst_block, measured.worst_block)
            run.worst_bits = max(run.worst_bits, measured.phash_bits or 0)
        else:
            anchor = picture
    return run


def measure_rule(quick: bool) -> dict[str, Any]:
    """The rule over every generated clip: reuse shares, per group."""
    count, source, fitted = (24, (128, 96), 96) if quick else (40, (192, 128), 128)
    sizes = [(source, fitted)] if quick else [(source, fitted), ((384, 256), 256)]
    rows = []
    for (clip_size, size), name in ((s, n) for s in sizes for n in
                                    (QUICK_PHOTOS if quick else PHOTOS)):
        for group, motions in (("held", HELD), ("moving", MOVING), ("outside", OUTSIDE)):
            for motion in motions:
                run = apply_rule(decoded(motion_clip(motion, count, clip_size, name), size))
                rows.append({"group": group, "clip": motion.label, "photo": name,
                             "size": size, "frames": run.frames, "reused": run.reused,
                             "share": run.share, "worst_shift": run.worst_shift,
                             "worst_block": run.worst_block, "worst_bits": run.worst_bits})
    held = [r["share"] for r in rows if r["group"] == "held"]
    moving = [r["reused"] for r in rows if r["group"] == "moving"]
    return {"rule": {"shift_levels": repeats.SHIFT_LEVELS, "block_levels": repeats.BLOCK_LEVELS,
                     "phash_bits": repeats.PHASH_BITS},
            "frames": count, "rows": rows, "held_min_share": min(held),
            "moving_reused": sum(moving), "moving_clips": len(moving)}


# -- the job path --------------------------------------------------------------------------
def make_app(models_dir: Path, style: str, backend: str, precision: str, size: int) -> Any:
    """An app with the embedded defaults (the in-process queue), cache and limits off."""
    from flask import Flask

    from flask_animegan import AnimeGAN

    app = Flask("bench-jobs")
    app.config.update(ANIMEGAN_MODELS_DIR=str(models_dir), ANIMEGAN_DEFAULT_STYLE=style,
                      ANIMEGAN_SHIPPED_STYLES=False, ANIMEGAN_BACKEND=backend,
                      ANIMEGAN_PRECISION=precision, ANIMEGAN_CACHE_TTL=0,
                      ANIMEGAN_RATE_LIMIT="", ANIMEGAN_SAMPLE_SIZE=0, ANIMEGAN_CSRF=False,
                      ANIMEGAN_MAX_SIDE=max(size, 64), ANIMEGAN_WARMUP_SIZE=size,
                      ANIMEGAN_MODEL_CACHE_DIR=str(models_dir.parent / "model-cache"))
    AnimeGAN(app)
    AnimeGAN.warm_up(app)
    return app


def run_job(service: Any, data: bytes, size: int) -> tuple[float, Any]:
    """Seconds for ``Jobs.run`` of ``data`` (the worker's function, in this thread)."""
    jobs = service.jobs
    info = jobs.probe(data)
    record = jobs.store.create(data, client="bench", style=service.engine.style(None).name,
                               size=size, kind=info.kind, format=info.format,
                               frames_total=info.frames)
    started = time.perf_counter()
    jobs.run(record.id)
    seconds = time.perf_counter() - started
    final = jobs.store.get(record.id)
    if final is None or final.state != "done":
        raise RuntimeError(f"the bench's job ended {final}")
    return seconds, final


def stills(data: bytes) -> list[bytes]:
    """Each frame of the clip at its own size, as a JPEG q90 still."""
    limits, decode = media.MediaLimits(), DecodeLimits()
    info = media.probe(data, limits, decode)
    out = []
    for frame in media.frames(data, info, limits, decode, size=max(info.width, info.height)):
        buffer = io.BytesIO()
        frame.image.save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def photo_path(service: Any, photos: list[bytes], size: int) -> float:
    """Seconds for ``Converter.photo`` of every still, one after the other."""
    request = service.parse({"size": size, "format": "jpeg"})
    started = time.perf_counter()
    for data in photos:
        service.converter.photo(data, request)
    return time.perf_counter() - started


def rss_mib() -> float:
    """This process's resident memory."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class CountingEngine:
    """The app's engine, sampling this process's RSS every ``every`` conversions."""

    def __init__(self, engine: Any, every: int) -> None:
        self.engine, self.every = engine, every
        self.calls = 0
        self.samples: list[tuple[int, float]] = []

    def run(self, image: Image.Image, style: str, **options: Any) -> Image.Image:
        result = self.engine.run(image, style, **options)
        self.calls += 1
        if self.calls % self.every == 0:
            self.samples.append((self.calls, rss_mib()))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


@dataclass(frozen=True)
class JobPlan:
    """Sizes and counts of the job section."""

    size: int
    clip_size: tuple[int, int]
    throughput_frames: int
    rounds: int
    saving_frames: int
    memory_frames: int
    memory_size: tuple[int, int]


FULL = JobPlan(size=256, clip_size=(384, 256), throughput_frames=30, rounds=3,
               saving_frames=60, memory_frames=250, memory_size=(192, 128))
QUICK = JobPlan(size=96, clip_size=(144, 96), throughput_frames=12, rounds=2,
                saving_frames=24, memory_frames=250, memory_size=(96, 64))


def measure(models_dir: Path, style: str, *, quick: bool, backend: str = "torch",
            precision: str = "fp32") -> dict[str, Any]:
    """The whole section: the rule, job path against photo path, saving, worker memory."""
    plan = QUICK if quick else FULL
    results: dict[str, Any] = {"size": plan.size, "rule": measure_rule(quick)}
    app = make_app(models_dir, style, backend, precision, plan.size)
    service = app.extensions["animegan"]
    with app.app_context():
        moving = encode_clip(motion_frames(Motion("pan", 2), plan.throughput_frames,
                                           plan.clip_size), plan.clip_size)
        photos = stills(moving)
        run_job(service, moving, plan.size)  # warm-up: this shape, the helper, the writer
        photo_path(service, photos[:2], plan.size)
        job_s, photo_s = [], []
        for _ in range(plan.rounds):  # in turns, so drift hits both alike
            seconds, final = run_job(service, moving, plan.size)
            job_s.append(seconds)
            photo_s.append(photo_path(service, photos, plan.size))
        frames = final.frames_done
        job_fps = frames / min(job_s)
        photo_ips = len(photos) / min(photo_s)
        results["throughput"] = {
            "frames": frames, "reused": final.frames_reused, "rounds": plan.rounds,
            "job_s": job_s, "photo_s": photo_s, "job_fps": job_fps, "photo_ips": photo_ips,
            "job_vs_photo": job_fps / photo_ips}

        held = plan.saving_frames // 2
        clip = encode_clip(_held_then_pan(plan.saving_frames, held, plan.clip_size),
                           plan.clip_size)
        with_s, without_s = [], []
        for _ in range(plan.rounds):  # in turns, as above
            seconds, record = run_job(service, clip, plan.size)
            with_s.append(seconds)
            service.converter.reuse_repeats = False
            try:
                seconds, plain = run_job(service, clip, plan.size)
                without_s.append(seconds)
            finally:
                service.converter.reuse_repeats = True
        with_reuse, without = min(with_s), min(without_s)
        converted = record.frames_done - record.frames_reused
        results["saving"] = {
            "frames": record.frames_done, "held_frames": held, "crf": 23,
            "converted": converted, "converted_share": converted / record.frames_done,
            "converted_without": plain.frames_done - plain.frames_reused,
            "seconds": with_s, "seconds_without": without_s,
            "time_vs_without": with_reuse / without}

        long_clip = encode_clip(motion_frames(Motion("pan", 1), plan.memory_frames,
                                              plan.memory_size), plan.memory_size)
        counting = CountingEngine(service.converter.engine, 10)
        service.converter.engine = counting
        try:
            seconds, record = run_job(service, long_clip, max(plan.memory_size))
        finally:
            service.converter.engine = counting.engine
        samples = counting.samples
        at_50 = next(mib for calls, mib in samples if calls >= 50)
        results["memory"] = {
            "frames": record.frames_done, "converted": counting.calls,
            "size": max(plan.memory_size), "seconds": seconds, "samples": samples,
            "rss_at_50_mib": at_50, "rss_last_mib": samples[-1][1],
            "rss_growth_pct": (samples[-1][1] - at_50) / at_50 * 100,
            "rss_peak_mib": max(mib for _, mib in samples)}
    return results


def _held_then_pan(count: int, held: int, size: tuple[int, int]) -> Iterator[Image.Image]:
    """``held`` frames of a held shot, then a pan of 2 px a frame."""
    yield from motion_frames(Motion("static"), held, size)
    yield from motion_frames(Motion("pan", 2), count - held, size)


# -- the report ----------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def render(section: dict[str, Any]) -> str:
    """The section's tables."""
    parts = []
    rule = section["rule"]
    limits = rule["rule"]
    parts.append(f"Repeat rule (shift <= {limits['shift_levels']:g} levels, every 8x8 block "
                 f"<= {limits['block_levels']:g} levels, phash <= {limits['phash_bits']} "
                 f"bits), {rule['frames']}-frame H.264 clips at {FPS} fps; share of frames "
                 "reused (min-max over the photos):")
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for row in rule["rows"]:
        grouped.setdefault((row["group"], row["clip"], row["size"]), []).append(row)
    rows = []
    for (group, clip, size), runs in grouped.items():
        shares = [r["share"] for r in runs]
        rows.append([group, clip, size, f"{min(shares) * 100:.0f}-{max(shares) * 100:.0f} %",
                     f"{max(r['worst_shift'] for r in runs):.2f}",
                     f"{max(r['worst_block'] for r in runs):.2f}"])
    parts.append(_table(["group", "clip", "px", "reused", "worst shift reused",
                         "worst block reused"], rows))
    parts.append(f"held shots: at least {rule['held_min_share'] * 100:.0f} % reused; moving "
                 f"clips: {rule['moving_reused']} frames reused over {rule['moving_clips']} clips")
    if "throughput" in section:
        t, s, m = section["throughput"], section["saving"], section["memory"]
        parts.append(_table(["", "value"], [
            [f"job path ({t['frames']}-frame pan, {section['size']} px), frames/s",
             f"{t['job_fps']:.2f}"],
            ["photo path (the same frames as JPEG stills), images/s", f"{t['photo_ips']:.2f}"],
            ["job vs photo", f"{t['job_vs_photo']:.3f}"],
            [(f"held shot clip ({s['held_frames']} held of {s['frames']}, crf {s['crf']}): "
             "converted"), f"{s['converted']}/{s['frames']} ({s['converted_share'] * 100:.0f} %)"],
            ["time with reuse vs without", f"{s['time_vs_without']:.3f}"],
            [f"worker RSS over a {m['frames']}-frame job ({m['size']} px): at frame 50, MiB",
             f"{m['rss_at_50_mib']:.1f}"],
            ["last sample, MiB (growth)", (f"{m['rss_last_mib']:.1f} "
                                          f"({m['rss_growth_pct']:+.1f} %)")],
        ]))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.jobs",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rule-only", action="store_true",
                        help="only the repeat rule (no model, a few seconds)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    from flask_animegan.process import configure_process

    from .ceilings import usable_cpus

    configure_process(usable_cpus())
    if args.rule_only:
        section: dict[str, Any] = {"rule": measure_rule(args.quick)}
    else:
        from .inputs import prepare_weights

        with tempfile.TemporaryDirectory(prefix="animegan-bench-jobs-") as workdir:
            weights = prepare_weights(Path(workdir) / "models")
            section = measure(weights.models_dir, weights.style, quick=args.quick)
    print(render(section))
    if args.out:
        args.out.write_text(json.dumps(section, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
