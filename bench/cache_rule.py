"""The result cache, measured: whom its rule shares a result with, and what a hit saves.

Run: ``.venv/bin/python -m bench.cache_rule [--quick]`` (also a section of ``python -m bench``).

Client A uploads a scikit-image photo (as PNG, or as JPEG q90); then, at several output
sizes, through the service's decoder and the real ``NearDuplicateCache``:

- **re-encodes**: A's photo saved again as JPEG q70-95 (same pixel size). These must hit.
- **another client** sends A's photo: must miss (the namespace holds the client).
- **local edits**: A's photo with a box of 1 or 3 % of it covered, recoloured, blurred or
  pixelated at seeded random places, saved as JPEG q90. Those that change their box by
  VISIBLE levels or more (fitted) must miss.

Each trial records the pHash distance and the largest grid difference, so the table of
hits for every T is one run. Then a hit's and a miss's time through
``AnimeGANService.convert_upload`` with the real model at 512 px.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import skimage.data
from flask import Flask
from PIL import Image, ImageDraw, ImageFilter, ImageOps

from flask_animegan import AnimeGAN
from flask_animegan.cache.near_duplicate import GRID_LEVELS, Fingerprint, NearDuplicateCache
from flask_animegan.inputs.decoding import DecodeLimits, decode_upload

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "cat", "hubble_deep_field",
          "immunohistochemistry", "retina", "stereo_motorcycle", "camera", "coins", "moon",
          "clock", "grass", "gravel", "brick", "cell", "page", "text")
QUICK_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
SIZES = (256, 384, 512)
QUALITIES = (70, 75, 80, 85, 90, 95)
AREAS = (0.01, 0.03)
VISIBLE = 2.0  # levels: an edit changing its box by less, on average (fitted), is not counted
MAX_DISTANCE = 6  # ANIMEGAN_PHASH_MAX_DISTANCE's default
LEVELS = (1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4)  # the T compared


def photo(name: str) -> Image.Image:
    array = getattr(skimage.data, name)()  # a few are (picture, ...) tuples
    return Image.fromarray(np.asarray(array[0] if isinstance(array, tuple) else array)).convert(
        "RGB")


def saved(image: Image.Image, fmt: str = "JPEG", **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def fitted(data: bytes, size: int) -> Image.Image:
    """The upload as the network sees it (the service's decode and fit)."""
    return decode_upload(data, DecodeLimits(max_pixels=10**8), size=size).image


Box = tuple[int, int, int, int]


def cover(image: Image.Image, box: Box, rng: random.Random) -> None:
    """A box filled with one colour (a sticker, a redaction)."""
    ImageDraw.Draw(image).rectangle((box[0], box[1], box[2] - 1, box[3] - 1),
                                    fill=tuple(rng.randrange(256) for _ in range(3)))


def recolour(image: Image.Image, box: Box, rng: random.Random) -> None:
    """The box's channels swapped (a recoloured shirt, a dyed object)."""
    red, green, blue = image.crop(box).split()
    order = (blue, red, green) if rng.random() < 0.5 else (green, blue, red)
    image.paste(Image.merge("RGB", order), box[:2])


def blur(image: Image.Image, box: Box, rng: random.Random) -> None:
    """A Gaussian blur of radius 8-16 % of the box's side (a hidden face)."""
    radius = rng.uniform(0.08, 0.16) * min(box[2] - box[0], box[3] - box[1])
    image.paste(image.crop(box).filter(ImageFilter.GaussianBlur(radius)), box[:2])


def pixelate(image: Image.Image, box: Box, rng: random.Random) -> None:
    """A mosaic 4-8 blocks across (a hidden licence plate)."""
    part, blocks = image.crop(box), rng.randint(4, 8)
    small = part.resize((blocks, max(1, round(blocks * part.height / part.width))),
                        Image.Resampling.BOX)
    image.paste(small.resize(part.size, Image.Resampling.NEAREST), box[:2])


EDITS: dict[str, Callable[[Image.Image, Box, random.Random], None]] = {
    "cover": cover, "recolour": recolour, "blur": blur, "pixelate": pixelate}


def edited(image: Image.Image, kind: str, area: float, seed: object) -> tuple[Image.Image, Box]:
    """``image`` with a box of ``area`` of it edited with ``kind`` at a seeded random place."""
    rng = random.Random(f"{seed}/{kind}/{area}")
    width, height = (max(2, round(side * area ** 0.5)) for side in image.size)
    left, top = rng.randrange(image.width - width + 1), rng.randrange(image.height - height + 1)
    copy, box = image.copy(), (left, top, left + width, top + height)
    EDITS[kind](copy, box, rng)
    return copy, box


def trials(photos: Sequence[str], seeds: int) -> list[dict[str, Any]]:
    """Every trial: group, kind, size, photo, pHash distance, grid levels, box change."""
    rows: list[dict[str, Any]] = []
    for name in photos:
        image = photo(name)
        originals = {"PNG": saved(image, "PNG"), "JPEG q90": saved(image, quality=90)}
        sent = Image.open(io.BytesIO(originals["JPEG q90"])).convert("RGB")
        for size in SIZES:
            for origin, data in originals.items():
                first = Fingerprint.of(fitted(data, size))
                for quality in QUALITIES:
                    copy = Fingerprint.of(fitted(saved(sent, quality=quality), size))
                    rows.append(_row("re-encode", f"q{quality} of {origin}", size, name,
                                     first, copy))
            first_image = fitted(originals["JPEG q90"], size)
            first, scale = Fingerprint.of(first_image), first_image.width / image.width
            for kind in EDITS:
                for area in AREAS:
                    for seed in range(seeds):
                        copy_image, box = edited(sent, kind, area, f"{seed}/{name}/{size}")
                        second = fitted(saved(copy_image, quality=90), size)
                        fitted_box = tuple(round(v * scale) for v in box)
                        change = float(np.abs(
                            np.asarray(first_image.crop(fitted_box), np.float32)
                            - np.asarray(second.crop(fitted_box), np.float32)).mean())
                        rows.append(_row("edit", kind, size, name, first,
                                         Fingerprint.of(second), change=change, area=area))
    return rows


def _row(group: str, kind: str, size: int, name: str, a: Fingerprint, b: Fingerprint,
         **extra: float) -> dict[str, Any]:
    return {"group": group, "kind": kind, "size": size, "photo": name,
            "same_size": a.size == b.size, "distance": a.distance(b),
            "levels": a.grid_levels(b), "hit": a.same_photo(b, MAX_DISTANCE), **extra}


def other_client_hits(photos: Sequence[str]) -> tuple[int, int]:
    """A's photo re-encoded, sent by client B: (hits, trials), through the real cache."""
    cache = NearDuplicateCache(ttl=3600, max_bytes=10**8)
    hits = 0
    for name in photos:
        sent = saved(photo(name), quality=90)
        for size in SIZES:
            cache.put(("A", "style", size, "jpeg"), Fingerprint.of(fitted(sent, size)), b"A's",
                      (1, 1), upload=cache.upload_digest(sent))
            lookup = cache.lookup(("B", "style", size, "jpeg"))
            copy = saved(Image.open(io.BytesIO(sent)), quality=85)
            hits += bool(lookup.same_upload(cache.upload_digest(sent))
                         or lookup.same_photo(Fingerprint.of(fitted(copy, size))))
    return hits, len(photos) * len(SIZES)


def _hits(rows: Sequence[dict[str, Any]], levels: float) -> int:
    return sum(r["same_size"] and r["distance"] <= MAX_DISTANCE and r["levels"] <= levels
               for r in rows)


def service_times(models_dir: Path | None, style: str | None, size: int = 512,
                  repeats: int = 3) -> dict[str, Any]:
    """Milliseconds of a miss (JPEG q90), of the same photo re-encoded at q85 (a near hit)
    and of the same file again (a digest hit), through ``convert_upload``."""
    with tempfile.TemporaryDirectory() as folder:
        if models_dir is None:  # seeded random weights, as tests/conftest.py makes them
            import torch

            from flask_animegan import Generator

            torch.manual_seed(0)
            models_dir, style = Path(folder), "bench_style"
            torch.save(Generator().state_dict(), models_dir / "bench_style.pt")
        app = Flask("bench_cache")
        app.config.update(ANIMEGAN_MODELS_DIR=str(models_dir), ANIMEGAN_DEFAULT_STYLE=style,
                          ANIMEGAN_SHIPPED_STYLES=False, ANIMEGAN_SAMPLE_SIZE=0,
                          ANIMEGAN_RATE_LIMIT="", ANIMEGAN_CACHE_TTL=3600,
                          ANIMEGAN_WARMUP_SIZE=size, ANIMEGAN_MAX_SIDE=size,
                          ANIMEGAN_BACKEND="torch", ANIMEGAN_PRECISION="fp32", ANIMEGAN_CSRF=False)
        AnimeGAN(app)
        AnimeGAN.warm_up(app)
        service = app.extensions["animegan"]
        base = photo("astronaut").resize((1080, 1080), Image.Resampling.LANCZOS)
        variants = (ImageOps.invert(base), base, ImageOps.mirror(base), ImageOps.flip(base))
        times: dict[str, list[float]] = {"miss": [], "near hit": [], "same file": []}
        confirmed = dict.fromkeys(times, 0)
        stages: list[dict[str, float]] = []
        for index, variant in enumerate(variants[:repeats + 1]):
            sent = saved(variant, quality=90)
            for label, data in (("miss", sent), ("near hit", saved(variant, quality=85)),
                                ("same file", sent)):
                started = time.perf_counter()
                done = service.convert_upload(data, size=size, fmt="jpeg", client="bench")
                if index:  # the first variant warms up this shape
                    times[label].append((time.perf_counter() - started) * 1000)
                    confirmed[label] += done.cache_hit == (label != "miss")
                    stages += [done.timings] if label == "near hit" else []
    ms = {label: statistics.median(values) for label, values in times.items()}
    return {"size": size, "repeats": repeats, "backend": "torch fp32", **{
        f"{label.replace(' ', '_')}_ms": value for label, value in ms.items()},
        "near_hit_vs_miss": ms["near hit"] / ms["miss"], "confirmed": confirmed,
        "near_hit_stages_ms": {stage: statistics.median(t[stage] for t in stages)
                               for stage in stages[0]}}


def measure(quick: bool = False, models_dir: Path | None = None,
            style: str | None = None) -> dict[str, Any]:
    """Every figure, as JSON for ``python -m bench``."""
    photos = QUICK_PHOTOS if quick else PHOTOS
    rows = trials(photos, seeds=1 if quick else 3)
    reencodes = [r for r in rows if r["group"] == "re-encode"]
    edits = [r for r in rows if r["group"] == "edit"]
    visible = [r for r in edits if r["change"] >= VISIBLE]
    hits, asked = other_client_hits(photos)
    return {
        "photos": len(photos), "sizes": SIZES, "T": GRID_LEVELS, "max_distance": MAX_DISTANCE,
        "reencode_trials": len(reencodes), "reencode_hit_share": _hits(reencodes, GRID_LEVELS)
        / len(reencodes), "other_client_hits": hits, "other_client_trials": asked,
        "visible_edit_trials": len(visible),
        "visible_edit_hit_share": _hits(visible, GRID_LEVELS) / max(len(visible), 1),
        "by_T": {t: {"reencodes": _hits(reencodes, t) / len(reencodes),
                     **{kind: _hits([r for r in visible if r["kind"] == kind], t)
                        for kind in EDITS}, "visible edits": _hits(visible, t)} for t in LEVELS},
        "edits_per_kind": {kind: len([r for r in visible if r["kind"] == kind]) for kind in EDITS},
        "edit_hits_listed": [f"{r['kind']} {r['area']:.0%} @ {r['size']} px, {r['photo']}: "
                             f"box {r['change']:.1f} levels, grid {r['levels']}, pHash "
                             f"{r['distance']}" for r in visible if r["hit"]],
        "times": service_times(models_dir, style, repeats=1 if quick else 3),
    }


def render(r: dict[str, Any]) -> str:
    """The figures as markdown."""
    head = f"| T | re-encodes hit | {' | '.join(EDITS)} | visible edits hit |"
    rows = [f"| {t} | {v['reencodes']:.1%} | " + " | ".join(
        f"{v[k]}/{r['edits_per_kind'][k]}" for k in EDITS)
        + f" | {v['visible edits']}/{r['visible_edit_trials']} |" for t, v in r["by_T"].items()]
    t = r["times"]
    return "\n".join([
        f"{r['photos']} photos at {', '.join(map(str, r['sizes']))} px; T = {r['T']}, "
        f"pHash within {r['max_distance']} bits: re-encodes (q70-95) hit "
        f"{r['reencode_hit_share']:.1%} of {r['reencode_trials']}; another client "
        f"{r['other_client_hits']}/{r['other_client_trials']}; visible edits "
        f"{r['visible_edit_hit_share']:.1%} of {r['visible_edit_trials']}", "",
        head, "|---" * (len(EDITS) + 3) + "|", *rows, "",
        *[f"- hit: {line}" for line in r["edit_hits_listed"]],
        f"- at {t['size']} px ({t['backend']}): miss {t['miss_ms']:.0f} ms, near hit "
        f"{t['near_hit_ms']:.1f} ms, same file {t['same_file_ms']:.1f} ms; near-hit stages "
        f"{t['near_hit_stages_ms']}; confirmed {t['confirmed']}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_rule",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 photos, one seed")
    print(render(measure(parser.parse_args(argv).quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
