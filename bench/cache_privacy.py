"""Whether the result cache tells a photo from its locally edited copy.

Run: ``.venv/bin/python -m bench.cache_privacy [--seeds N | --quick]``.

Client A uploads a photo; client B uploads the same photo with a face blurred, a region
pixelated, a sticker or caption on it, or a patch pasted over (about 1 % of the area).
B must not get A's result (it would show what B hid), nor A B's (a planted doctored
copy). Copies that only differ by JPEG re-encoding (quality 70-95) or a +-5 % resize
must still share it. This script measures both with the real ``NearDuplicateCache``
on every photo x edit x output size, and prints the distributions of
``Fingerprint.local_difference`` that its tolerance was chosen from.

The photos are scikit-image's (no download): 18 whole photos plus 4 crops taken at full
resolution from the largest ones (the crops do not overlap each other, but each lies
inside its parent photo, which is seen there at a smaller scale). Edits are made on the
fitted input at the output scale (and, as a second protocol, on the photo at its own
resolution), at a seeded random place (smooth regions included), and uploaded
losslessly, as JPEG q90 or as lossy WebP q80; a third protocol has A upload a JPEG q90
and B edit that file at its own resolution and save it as JPEG q90 or q75; a fourth
repeats the second without giving the cache the files (as for uploads over the limits
for keeping one whole, such as a phone's 12-megapixel photo). An edit counts
as a hit if a cache holding either copy answers the other; for each hit, the report says
how much the result handed out differs over the edited box from the copy's own result
(converted with the shipped style). ``tests/test_cache.py`` runs one seed of this.
Self-contained (no ``bench`` imports) so the tests can load it by path.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import skimage.data
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from bench.report import table
from flask_animegan.cache import jpeg_grid
from flask_animegan.cache.jpeg_grid import (
    UPLOAD_MAX_BYTES,
    grid_of,
    same_source,
    same_upload,
)
from flask_animegan.cache.near_duplicate import (
    ASPECT_TOLERANCE,
    Fingerprint,
    NearDuplicateCache,
    encode_source,
)
from flask_animegan.inputs import decoding

WHOLE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                "immunohistochemistry", "retina", "stereo_motorcycle", "camera", "coins", "moon",
                "clock", "grass", "gravel", "brick", "cell", "page", "text")
CROPS = {  # name: (photo, box) at the photo's full resolution
    "retina-vessels": ("retina", (150, 350, 650, 850)),
    "hubble-corner": ("hubble_deep_field", (500, 472, 1000, 872)),
    "motorcycle-left": ("stereo_motorcycle", (0, 0, 370, 500)),
    "astronaut-flag": ("astronaut", (0, 0, 160, 256)),
}
PHOTOS = WHOLE_PHOTOS + tuple(CROPS)
SIZES = (256, 512)
EDIT_SIDE = 0.10  # of each side: 1 % of the area
HASH_SIZE = 16  # ANIMEGAN_PHASH_SIZE's default
VISIBLE = 2.0  # mean absolute change (levels) over the edited box below which nothing shows
BENIGN_KINDS = ("jpeg q70", "jpeg q85", "jpeg q95", "resize 95%", "resize 105%")
PROTOCOLS = {
    "png/png": "A uploads a lossless file; the copy is re-encoded (JPEG, then saved "
               "losslessly) or resized and saved losslessly",
    "jpeg/jpeg": "A uploads JPEG q90; the copy is A's file re-encoded at that quality, "
                 "or resized and saved as JPEG q90 (the usual case)",
    "png/jpeg": "A uploads a lossless file, the copy is a JPEG: the decoder's reduced-scale "
                "JPEG path then differs from the lossless one (the hardest case)",
}


# -- inputs ------------------------------------------------------------------------------
def photo(name: str) -> Image.Image:
    """One of :data:`PHOTOS` as an RGB image."""
    source, box = CROPS.get(name, (name, None))
    array = getattr(skimage.data, source)()
    if isinstance(array, tuple):
        array = array[0]
    image = Image.fromarray(np.asarray(array)).convert("RGB")
    return image.crop(box) if box else image


#: Photos also tried as a phone's 12-megapixel JPEG (upscaled, with grain).
LARGE_PHOTOS = ("astronaut", "coffee", "rocket", "stereo_motorcycle")
LARGE_PIXELS = 12_000_000


def large_photo(name: str) -> Image.Image:
    """``name`` upscaled to :data:`LARGE_PIXELS` with seeded sensor-like grain (an
    upscaled photo alone is smoother than any camera's)."""
    image = photo(name)
    scale = math.sqrt(LARGE_PIXELS / (image.width * image.height))
    image = image.resize((round(image.width * scale), round(image.height * scale)),
                         Image.Resampling.LANCZOS)
    grain = np.random.default_rng(sum(name.encode())).normal(0, 3, (image.height, image.width, 3))
    return Image.fromarray(np.clip(np.asarray(image, np.float32) + grain, 0, 255).astype(np.uint8))


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    if fmt == "PNG":
        params.setdefault("compress_level", 0)  # stored, not deflated: lossless all the same
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def upload(data: bytes, size: int) -> Image.Image:
    """What the service fingerprints: the upload decoded and fitted to ``size``."""
    return decoding.fit(decoding.decode_upload(data, decoding.DecodeLimits(max_pixels=10**8), size=size), size)


def resized(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)),
                        Image.Resampling.LANCZOS)


def original_file(image: Image.Image, protocol: str) -> bytes:
    """The file A uploads under ``protocol``."""
    return (encode(image, "JPEG", quality=90) if protocol == "jpeg/jpeg"
            else encode(image, "PNG", compress_level=6))


def benign_copy(image: Image.Image, original: bytes, protocol: str, kind: str) -> bytes:
    """The file B uploads: A's photo re-encoded or resized as ``protocol`` and ``kind`` say."""
    source = decoded(original) if protocol == "jpeg/jpeg" else image
    if kind.startswith("jpeg"):
        copy = encode(source, "JPEG", quality=int(kind.removeprefix("jpeg q")))
        return encode(decoded(copy), "PNG") if protocol == "png/png" else copy
    copy = resized(source, int(kind.removeprefix("resize ").rstrip("%")) / 100)
    return encode(copy, "PNG") if protocol == "png/png" else encode(copy, "JPEG", quality=90)


# -- local edits (on the fitted input, at the output scale) --------------------------------
Box = tuple[int, int, int, int]


def edit_box(image: Image.Image, rng: random.Random) -> Box:
    width, height = max(1, round(image.width * EDIT_SIDE)), max(1, round(image.height * EDIT_SIDE))
    left, top = rng.randrange(image.width - width + 1), rng.randrange(image.height - height + 1)
    return left, top, left + width, top + height


def blur(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> str:
    """Gaussian blur (radius 4-8 px) of the box, its surroundings as context like an editor."""
    radius = rng.uniform(4, 8)
    pad = round(3 * radius)
    outer = (max(0, box[0] - pad), max(0, box[1] - pad),
             min(image.width, box[2] + pad), min(image.height, box[3] + pad))
    blurred = image.crop(outer).filter(ImageFilter.GaussianBlur(radius))
    image.paste(blurred.crop((box[0] - outer[0], box[1] - outer[1],
                              box[2] - outer[0], box[3] - outer[1])), box[:2])
    return f"radius {radius:.1f}"


def pixelate(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> str:
    """Mosaic of 8-16 px blocks over the box."""
    block = rng.randint(8, 16)
    part = image.crop(box)
    small = part.resize((max(1, round(part.width / block)), max(1, round(part.height / block))),
                        Image.Resampling.BOX)
    image.paste(small.resize(part.size, Image.Resampling.NEAREST), box[:2])
    return f"blocks {block} px"


def overlay(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> str:
    """A solid or half-transparent rectangle, or a caption, in a random colour."""
    style = rng.choice(("solid", "translucent", "caption"))
    colour = tuple(rng.randrange(256) for _ in range(3))
    layer = Image.new("RGBA", image.size, (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    if style == "caption":
        font = ImageFont.load_default(size=max(8, round((box[3] - box[1]) * 0.7)))
        text = "".join(rng.choice("ABCDEFGHKMNRSTWXZ") for _ in range(3))
        draw.text(box[:2], text, fill=colour + (255,), font=font)
        layer = layer.crop(box)  # a caption stays inside its box
        image.paste(Image.alpha_composite(image.crop(box).convert("RGBA"), layer).convert("RGB"),
                    box[:2])
        return f"caption {text}"
    draw.rectangle((box[0], box[1], box[2] - 1, box[3] - 1),
                   fill=colour + (255 if style == "solid" else 128,))
    image.paste(Image.alpha_composite(image.convert("RGBA"), layer).convert("RGB"))
    return f"{style} rectangle"


def paste(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> str:
    """A patch copied from elsewhere in the photo, or from another photo."""
    width, height = box[2] - box[0], box[3] - box[1]
    source, where = (image.copy(), "same photo") if rng.random() < 0.5 else (donor, "other photo")
    left = rng.randrange(source.width - width + 1)
    top = rng.randrange(source.height - height + 1)
    image.paste(source.crop((left, top, left + width, top + height)), box[:2])
    return f"patch from {where}"


EDITS: dict[str, Callable[[Image.Image, Box, random.Random, Image.Image], str]] = {
    "blur": blur, "pixelate": pixelate, "overlay": overlay, "paste": paste}


def edited(image: Image.Image, kind: str, rng: random.Random,
           donor: Image.Image) -> tuple[Image.Image, str, Box]:
    """A copy of ``image`` with one local edit, its description and its box."""
    copy = image.copy()
    box = edit_box(copy, rng)
    detail = EDITS[kind](copy, box, rng, donor.resize(image.size))
    return copy, detail, box


def changes(image: Image.Image, copy: Image.Image, box: Box, size: int) -> tuple[float, float]:
    """The mean change (levels) the edit makes over its box, and the one a JPEG q90
    re-encode of ``image`` makes there (an edit below that is one no statistic of the two
    pictures can tell from re-encoding), both as the service sees them: fitted to ``size``."""
    reencoded = encode(image, "JPEG", quality=90)
    before, after, noise = (upload(data, size) for data in
                            (encode(image, "PNG"), encode(copy, "PNG"), reencoded))
    scale = before.width / image.width
    fitted_box = tuple(round(v * scale) for v in box)
    before, after, noise = (np.asarray(im.crop(fitted_box), np.float32)
                            for im in (before, after, noise))
    return float(np.abs(after - before).mean()), float(np.abs(noise - before).mean())


# -- trials --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    group: str  # "benign" or "edit"
    kind: str  # protocol + benign kind, or edit kind
    size: int
    photo: str
    hit: bool  # the real cache's answer (edits: holding either copy, asked for the other)
    score: float  # Fingerprint.local_difference
    hit_before: bool  # the answer of the checks before the local ones (phash, aspect, colours)
    change: float = 0.0  # edits: mean absolute change over the box (levels)
    reencode_change: float = 0.0  # edits: what a JPEG q90 re-encode changes there (levels)
    detail: str = ""
    # edits that hit: how much the result handed out differs over the box from the copy's
    # own result, and from that of the unedited photo saved the copy's way (levels)
    revealed: float = math.nan
    revealed_benign: float = math.nan

    @property
    def visible(self) -> bool:
        return self.change >= VISIBLE


def answers(stored: Fingerprint, asked: Fingerprint) -> bool:
    """Whether a cache holding ``stored`` answers ``asked`` with its result."""
    cache = NearDuplicateCache(max_bytes=10**9, ttl=3600, hash_size=HASH_SIZE)
    cache.put(("bench",), stored, b"A's result", stored.source.size if stored.source else (1, 1))
    return cache.get(("bench",), asked) is not None


def lookup(original: Fingerprint, copy: Image.Image, both_ways: bool = False,
           data: bytes = b"") -> tuple[bool, float, bool]:
    """Whether a cache holding ``original`` answers ``copy`` (uploaded as ``data``) with
    it (``both_ways``: or one holding ``copy`` answers ``original``: a planted copy), their
    local score, and whether the checks before the local ones (phash, aspect, colours)
    would let it hit."""
    found = Fingerprint.of(copy, HASH_SIZE, data)
    checks = NearDuplicateCache(max_bytes=1, ttl=1, hash_size=HASH_SIZE)
    before = (original.distance(found) <= checks.max_distance
              and abs(found.aspect / original.aspect - 1) <= ASPECT_TOLERANCE
              and found.same_colors(original, checks.color_tolerance))
    hit = answers(original, found) or (both_ways and answers(found, original))
    return hit, original.local_difference(found), before


@contextlib.contextmanager
def over_limits(active: bool = True) -> Iterator[None]:
    """While active, no upload is small enough for the cache to keep whole."""
    saved = jpeg_grid.UPLOAD_MAX_BYTES
    jpeg_grid.UPLOAD_MAX_BYTES = 0 if active else saved
    try:
        yield
    finally:
        jpeg_grid.UPLOAD_MAX_BYTES = saved


def benign_trials(photos: Iterable[str], sizes: Sequence[int],
                  protocols: Iterable[str], large: bool = False,
                  unkept: bool = False) -> list[Trial]:
    """Every photo x protocol x benign copy x size (``large``: on :func:`large_photo`;
    ``unkept``: under :func:`over_limits`)."""
    trials = []
    label = "12 MP " if large else "over the limits " if unkept else ""
    for name in photos:
        image = large_photo(name) if large else photo(name)
        for protocol in protocols:
            original = original_file(image, protocol)
            with over_limits(unkept):
                prints = {size: Fingerprint.of(upload(original, size), HASH_SIZE, original)
                          for size in sizes}
            for kind in BENIGN_KINDS:
                copy = benign_copy(image, original, protocol, kind)
                for size in sizes:
                    with over_limits(unkept):
                        found = lookup(prints[size], upload(copy, size), data=copy)
                    trials.append(Trial("benign", f"{label}{protocol} {kind}", size, name, *found))
    return trials


EDIT_SCALES = {
    "edit": "made on the fitted input (the picture the service converts), then saved",
    "edit at full scale": "made on the photo at its own resolution, then saved; the "
                          "service fits the upload (JPEG copies larger than the output are "
                          "decoded at a reduced DCT scale)",
    "edit of the JPEG at full scale": "A uploads the photo as JPEG q90; B edits that file "
                                      "at its own resolution and saves it again (the "
                                      "usual case with a phone's photo)",
    "edit of a 12-megapixel JPEG": "as the last, on 4 photos as a phone's 12-megapixel "
                                   "JPEG (upscaled, with grain)",
    "edit at full scale, files over the keeping limits": "as at full scale, with the "
        "limits for keeping a file whole set to 0 (as for uploads over 8 MiB or 12.6 "
        "megapixels): such a resized upload shares only identical pixels",
}
#: How an edited copy is saved: format and encoder options.
SAVED = {"PNG": ("PNG", {}), "JPEG": ("JPEG", {"quality": 90}),
         "JPEG q75": ("JPEG", {"quality": 75}), "WEBP": ("WEBP", {"quality": 80})}


@functools.cache
def _model() -> Any:
    from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
    from flask_animegan.runtime.weights import load_generator

    return load_generator(SHIPPED_STYLES_DIR / "toon_demo.pt")


def converted(image: Image.Image) -> np.ndarray:
    """The shipped style's result for a fitted input, as float32 levels."""
    import torch

    with torch.inference_mode():
        return np.asarray(imaging.to_image(_model()(imaging.to_tensor(image))), np.float32)


def revealed(stored: Image.Image, copy: Image.Image, benign: Image.Image,
             box: Box) -> tuple[float, float]:
    """What a hit shows the uploader of ``copy``: the mean difference over ``box`` between
    the result handed out (``stored``'s) and the copy's own result; and the same for
    ``benign``, the unedited photo saved the copy's way (what any same-photo hit differs by).
    """
    result = converted(stored)
    return tuple(float(np.abs(converted(image)[box[1]:box[3], box[0]:box[2]]
                              - result[box[1]:box[3], box[0]:box[2]]).mean())
                 for image in (copy, benign))


def edit_trials(photos: Sequence[str], sizes: Sequence[int], seeds: Iterable[int],
                saved: Iterable[str] = ("PNG",), full_scale: bool = False,
                from_jpeg: bool = False, keep_files: bool = True,
                large: bool = False) -> list[Trial]:
    """Every photo x edit kind x size x seed, each copy uploaded in each ``saved`` way
    (a key of :data:`SAVED`).

    The edit is made on the fitted input, or with ``full_scale`` on the photo itself;
    ``from_jpeg``: A uploads the photo as JPEG q90 and the edit is made on that file at
    its own resolution (``large``: on :func:`large_photo`); without ``keep_files``, no
    file is small enough to keep (see :func:`over_limits`). An edit that hits
    also records what the hit reveals (:func:`revealed`), by converting with the shipped
    style.
    """
    trials = []
    from_jpeg = from_jpeg or large
    full_scale = full_scale or from_jpeg or not keep_files
    group = ("edit of a 12-megapixel JPEG" if large
             else "edit of the JPEG at full scale" if from_jpeg
             else "edit at full scale, files over the keeping limits" if not keep_files
             else "edit at full scale" if full_scale else "edit")
    prefix = "jpeg" if from_jpeg else "full" if full_scale else ""
    for index, name in enumerate(photos):
        image, donor = photo(name), photo(photos[(index + 1) % len(photos)])
        if large:
            image, donor = large_photo(name), large_photo(photos[(index + 1) % len(photos)])
        original_file = (encode(image, "JPEG", quality=90) if from_jpeg
                         else encode(image, "PNG", compress_level=6))  # as uploads are
        if from_jpeg:
            image = decoded(original_file)
        for size in sizes:
            original = upload(original_file, size)
            with over_limits(not keep_files):
                fingerprint = Fingerprint.of(original, HASH_SIZE, original_file)
            for seed in seeds:
                for kind in EDITS:
                    rng = random.Random(f"{prefix}{seed}/{name}/{size}/{kind}")
                    source = image if full_scale else original
                    copy, detail, box = edited(source, kind, rng, donor)
                    change, noise = changes(source, copy, box, size)
                    for way in saved:
                        fmt, params = SAVED[way]
                        data = encode(copy, fmt, **params)
                        received = upload(data, size)
                        with over_limits(not keep_files):
                            hit, score, before = lookup(fingerprint, received, True, data)
                        shown = (math.nan, math.nan)
                        if hit:
                            scale = original.width / source.width
                            shown = revealed(original, received,
                                             upload(encode(source, fmt, **params), size),
                                             tuple(round(v * scale) for v in box))
                        trials.append(Trial(group, kind, size, name, hit, score, before,
                                            change, noise, f"{detail}, saved {way}", *shown))
    return trials


# -- report --------------------------------------------------------------------------------
def hits(trials: Sequence[Trial]) -> str:
    return f"{sum(t.hit for t in trials)}/{len(trials)}" if trials else "-"


def quantiles(values: Sequence[float], qs: Sequence[float]) -> list[str]:
    return [f"{np.quantile(values, q):.2f}" for q in qs] if values else ["-"] * len(qs)


def report(trials: Sequence[Trial], sizes: Sequence[int], tolerance: float) -> str:
    benign = [t for t in trials if t.group == "benign"]
    edits = [t for t in trials if t.group == "edit"]
    everything = [t for t in trials if t.group != "benign"]
    out = []
    by_kind: dict[str, list[Trial]] = defaultdict(list)
    for t in benign:
        by_kind[t.kind].append(t)
    groups = dict(by_kind)
    for protocol in PROTOCOLS:
        groups[f"**{protocol} all**"] = [t for t in benign if t.kind.startswith(protocol + " ")]
    for label in ("12 MP", "over the limits"):  # the latter's hits: photos not resized
        groups[f"**{label} all**"] = [t for t in benign if t.kind.startswith(label + " ")]
    rows = [[label] + [hits([t for t in group if t.size == s]) for s in sizes]
            + [hits(group), hits([replace(t, hit=t.hit_before) for t in group])]
            for label, group in groups.items() if group]
    out += ["## Same photo (should hit): hits/total", "",
            table(["protocol, copy"] + [f"{s} px" for s in sizes]
                  + ["all", "all, by the checks before the local ones"], rows), ""]
    out += [f"- {p}: {d}" for p, d in PROTOCOLS.items()]
    out += ["- 12 MP: jpeg/jpeg on 4 photos upscaled to 12 megapixels with grain (a phone's)",
            "- over the limits: jpeg/jpeg with no file small enough to keep whole: a resized "
            "upload then shares only identical pixels (its hits are photos the output size "
            "does not resize)", ""]

    for scale, description in EDIT_SCALES.items():
        rows = []
        for kind in list(EDITS) + [None]:
            for fmt in (*SAVED, None):
                group = [t for t in trials if t.group == scale and kind in (None, t.kind)
                         and (fmt is None or t.detail.endswith(f"saved {fmt}"))]
                if not group or (fmt is not None and kind is not None):
                    continue
                label = f"{kind or '**all**'}{f', saved {fmt}' if fmt else ''}"
                rows.append([label] + [hits([t for t in group if t.size == s]) for s in sizes]
                            + [hits(group), hits([t for t in group if t.visible]),
                               hits([replace(t, hit=t.hit_before) for t in group])])
        if rows:
            out += [f"## Local edits, 1 % of the area, {description} (should miss): hits/total",
                    "", table(["edit"] + [f"{s} px" for s in sizes]
                              + ["all", f"visible (>= {VISIBLE} levels, fitted)",
                                 "all, by the checks before the local ones"], rows), ""]

    qs = (0.5, 0.9, 0.95, 0.99, 1.0)
    rows = [[kind] + quantiles([t.score for t in group], qs) for kind, group in by_kind.items()]
    out += [f"## local_difference of same-photo copies (tolerance {tolerance})", "",
            table(["copy"] + ["median", "p90", "p95", "p99", "max"], rows), ""]
    qs = (0.0, 0.01, 0.05, 0.5)
    rows = [[f"{kind} {s} px"] + quantiles([t.score for t in edits
                                             if t.kind == kind and t.size == s and t.visible], qs)
            for kind in EDITS for s in sizes]
    out += [f"## local_difference of visible edits (mean change >= {VISIBLE} levels)", "",
            table(["edit"] + ["min", "p1", "p5", "median"], rows), ""]

    visible = [t.score for t in edits if t.visible]
    worst = {label: [t.score for t in benign if t.kind.endswith(label)]
             for label in ("jpeg q70", "resize 95%", "resize 105%")}
    same_path = [t.score for t in benign if not t.kind.startswith("png/jpeg")]
    if visible and same_path:
        mildest = min(visible)
        out += ["## Margins", ""]
        for label, scores in worst.items():
            if scores:
                out.append(f"- {label}: p95 {np.quantile(scores, .95):.2f}, max {max(scores):.2f}")
        out += [f"- same-path copies (png/png, jpeg/jpeg): p95 {np.quantile(same_path, .95):.2f},"
                f" p97 {np.quantile(same_path, .97):.2f}, max {max(same_path):.2f}",
                f"- mildest visible edit: {mildest:.2f} = {mildest / tolerance:.2f} x the "
                f"tolerance {tolerance}; p1 of visible edits: {np.quantile(visible, .01):.2f}", ""]
    misses = [t for t in benign if not t.hit and not t.kind.startswith("over the limits ")]
    leaks = [t for t in everything if t.hit]
    out += [f"## Same-photo copies that missed ({len(misses)}, besides those over the "
            "limits for keeping a file, which share only identical pixels)", ""]
    out += [f"- {t.kind} @ {t.size} px, {t.photo}: {t.score:.2f}" for t in misses] + [""]
    below_noise = [t for t in leaks if t.change <= 2 * t.reencode_change]
    within = [t for t in leaks if t.revealed <= t.revealed_benign]
    worst_ratio = max((t.revealed / max(t.revealed_benign, 1e-6) for t in leaks), default=0.0)
    out += [f"## Edited copies that hit ({len(leaks)})", "",
            f"{len(below_noise)} of them changed their box by at most twice what a JPEG q90 "
            "re-encode of the photo changes there (no statistic of the two pictures tells "
            "those from a re-encoded copy, and nothing they hide is visible).",
            f"What a hit reveals: the result handed out differs over the box from the copy's "
            f"own result by at most what the unedited photo, saved the copy's way, differs by "
            f"for {len(within)} of them (largest ratio {worst_ratio:.2f}).",
            "Saved as: " + ", ".join(f"{fmt} {sum(t.detail.endswith(f'saved {fmt}') for t in leaks)}"
                                     for fmt in SAVED) + ". A copy saved "
            "losslessly is bit-identical to the photo outside the edit, and one saved as JPEG at "
            "the size it is converted at is reproduced exactly there by re-encoding the photo "
            "with its tables: either misses whatever the edit changed. A lossy WebP shares a "
            "result only with identical pixels. A small file the service shrinks is kept "
            "whole and compared the same exact way at its own size; larger ones have only "
            "the statistical checks.",
            ""]
    out += [f"- {t.group}: {t.kind} @ {t.size} px, {t.photo} ({t.detail}): mean change {t.change:.2f} "
            f"levels (a q90 re-encode: {t.reencode_change:.2f}), score {t.score:.2f}; the "
            f"result handed out differs there by {t.revealed:.2f} levels from the copy's own "
            f"(the unedited photo saved that way: {t.revealed_benign:.2f})"
            for t in leaks]
    return "\n".join(out)


def costs(size: int = 512, repeats: int = 50) -> str:
    """Memory of one entry's fingerprint and kept input, and the time to take, keep and
    compare them."""
    image = upload(encode(photo("astronaut"), "PNG"), size)
    copy = upload(encode(photo("astronaut"), "JPEG", quality=85), size)
    resaved = upload(encode(image, "JPEG", quality=90), size)
    started = time.perf_counter()
    for _ in range(repeats):
        first = Fingerprint.of(image, HASH_SIZE)
    taking = (time.perf_counter() - started) / repeats
    second = Fingerprint.of(copy, HASH_SIZE)
    started = time.perf_counter()
    for _ in range(repeats):
        first.local_difference(second)
    comparing = (time.perf_counter() - started) / repeats
    started = time.perf_counter()
    for _ in range(repeats // 5):
        kept = encode_source(image, None)
    keeping = (time.perf_counter() - started) / (repeats // 5)
    sizes = [len(encode_source(upload(encode(photo(name), "PNG"), size), None)) / 1024
             for name in PHOTOS]
    started = time.perf_counter()
    for _ in range(repeats // 5):
        assert same_source(resaved, grid_of(resaved), image, None)
    exact = (time.perf_counter() - started) / (repeats // 5)
    whole = {}
    for image in (photo("rocket"), large_photo("coffee")):  # 0.27 and 12 megapixels
        kept_file = encode(image, "JPEG", quality=90)
        resaved_file = encode(decoded(kept_file), "JPEG", quality=75)  # a re-save: a verdict
        started = time.perf_counter()
        for _ in range(3):
            assert same_upload(resaved_file, kept_file) is not None
        whole[image.width * image.height / 1e6] = ((time.perf_counter() - started) / 3,
                                                   len(kept_file) / 1024)
    return (f"## Costs ({size} px input)\n\n- fingerprint: {first.nbytes / 1024:.1f} KiB per entry "
            f"(luma {first.luma.nbytes // 1024} KiB, colour {first.chroma.nbytes // 1024} KiB, "
            f"thumbnail {first.thumbnail.nbytes // 1024} KiB, cell hashes "
            f"{first.cells.nbytes // 1024} KiB), {taking * 1000:.1f} ms to take\n"
            f"- local check: {comparing * 1000:.2f} ms per candidate that passed the phash, "
            f"aspect and colour checks\n"
            f"- the kept input (lossless WebP, in the entry): {len(kept) / 1024:.0f} KiB for "
            f"this photo, {min(sizes):.0f}-{max(sizes):.0f} KiB (median "
            f"{np.median(sizes):.0f}) over the {len(PHOTOS)} photos; {keeping * 1000:.1f} ms "
            f"to encode\n"
            f"- exact re-save check (only when an input is an exact JPEG decode of the same "
            f"size as a candidate that passed every other check): {exact * 1000:.1f} ms\n"
            f"- an upload the service shrinks is kept whole (JPEG or PNG up to "
            f"{UPLOAD_MAX_BYTES >> 20} MiB) and the same check runs at its own size: "
            + ", ".join(f"{seconds * 1000:.0f} ms for a {mp:.2f}-megapixel JPEG pair "
                        f"({kib:.0f} KiB kept)" for mp, (seconds, kib) in whole.items()))


def sibling_jpegs(photos: Sequence[str], sizes: Sequence[int]) -> str:
    """How the exact re-save check judges two JPEGs saved from one photo at different
    qualities (neither a re-save of the other): ``None`` leaves it to the statistics,
    "edited" is a miss it causes (a cost, never a leak)."""
    verdicts: dict[str, int] = defaultdict(int)
    edited_pairs = []
    for name in photos:
        for size in sizes:
            image = upload(encode(photo(name), "PNG"), size)
            for first in (70, 85, 95, 100):
                for second in (70, 75, 85, 90, 95):
                    if first == second:
                        continue
                    a, b = (upload(encode(image, "JPEG", quality=q), size)
                            for q in (first, second))
                    verdict = same_source(b, grid_of(b), a, grid_of(a))
                    label = {True: "same", False: "edited", None: "no verdict"}[verdict]
                    verdicts[label] += 1
                    if verdict is False:
                        edited_pairs.append(f"{name} @ {size} px, q{first} and q{second}")
    total = sum(verdicts.values())
    return ("## Two JPEGs of one photo at different qualities (exact check's verdicts)\n\n"
            + ", ".join(f"{label}: {count}/{total}" for label, count in sorted(verdicts.items()))
            + "\n\n" + "\n".join(f"- edited: {pair}" for pair in edited_pairs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_privacy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="edits per photo x kind x size")
    parser.add_argument("--quick", action="store_true", help="one seed, lossless edits only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    seeds = range(1 if args.quick else args.seeds)
    trials = benign_trials(PHOTOS, SIZES, PROTOCOLS)
    saved = ("PNG",) if args.quick else ("PNG", "JPEG", "WEBP")
    trials += edit_trials(PHOTOS, SIZES, seeds, saved)
    trials += edit_trials(PHOTOS, SIZES, seeds, saved, full_scale=True)
    if not args.quick:
        trials += edit_trials(PHOTOS, SIZES, seeds, ("JPEG", "JPEG q75"), from_jpeg=True)
        trials += edit_trials(LARGE_PHOTOS, SIZES, [0], ("JPEG", "JPEG q75"), large=True)
        trials += benign_trials(LARGE_PHOTOS, SIZES, ["jpeg/jpeg"], large=True)
        trials += edit_trials(PHOTOS, SIZES, seeds, ("JPEG",), keep_files=False)
        trials += benign_trials(PHOTOS, SIZES, ["jpeg/jpeg"], unkept=True)
    tolerance = NearDuplicateCache(max_bytes=1, ttl=1).local_tolerance
    print(f"# Cache privacy: {len(PHOTOS)} photos x {len(EDITS)} edits x {len(SIZES)} sizes"
          f" x {len(seeds)} seeds\n")
    print(report(trials, SIZES, tolerance))
    if not args.quick:
        print("\n" + sibling_jpegs(PHOTOS, SIZES))
    print("\n" + costs())
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
