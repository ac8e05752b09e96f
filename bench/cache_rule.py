"""Whether the cache's one rule shares results between copies of a photo, and only those.

Run: ``.venv/bin/python -m bench.cache_rule [--quick]`` (also a section of ``python -m bench``).

Client A uploads a photo (scikit-image's, no download) and gets it converted; then:

- **re-encodes**: A's photo as JPEG q70-95, or resized by +-5 % and saved as JPEG q75 or
  q90, from a lossless original or from A's JPEG q90. These must hit (>= 95 %).
- **local edits**: B takes A's JPEG, edits a box of 1, 2 or 5 % of the picture at the
  photo's own resolution (blur, pixelate, a text box, a patch pasted from elsewhere) and
  saves it as JPEG q90. Each box is placed at a seeded random spot ("random") and at the
  most detailed of 40 seeded spots ("detail": where a face or a licence plate would be).
  A hit is a cache holding either copy answering the other. These must miss.
- **another client** asking for A's photo: must miss (the namespace holds the scope).
- **held out** (not in ``--quick``): the same trials on a centre crop (75 %) and a quarter
  turn of every photo, which were not used to choose the rule's numbers: how the rule
  does on pictures it was not tuned on.

Every upload goes through the service's decoder and fit, then the real
``NearDuplicateCache``. Also measured: the bytes of an entry and of a lookup on
``MemoryStorage`` (and on Redis, with ``MEMORY USAGE``, if ``redis-server`` is installed)
and the time of a fingerprint and a lookup. ``tests/test_cache.py`` runs a few of these
cases; self-contained (no ``bench`` imports) so it can load this file by path.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import skimage.data
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from flask_animegan.cache import NearDuplicateCache
from flask_animegan.cache import fingerprint as rule
from flask_animegan.cache.fingerprint import ASPECT_TOLERANCE, Fingerprint
from flask_animegan.cache.near_duplicate import INDEX_CAP
from flask_animegan.cache.storage import MemoryStorage, Storage
from flask_animegan.inputs.decoding import DecodedUpload, DecodeLimits, fitted_size
from flask_animegan.inputs.isolation import Decoder
from flask_animegan.cache.samples import of_picture

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
          "immunohistochemistry", "retina", "stereo_motorcycle", "camera", "coins", "moon",
          "clock", "grass", "gravel", "brick", "cell", "page", "text")
QUICK_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera", "stereo_motorcycle")
SIZES = (256, 512)
AREAS = (0.01, 0.02, 0.05)
PLACES = ("detail", "random")
VISIBLE = 2.0  # levels: an edit changing its box by less, on average, is not counted visible
HASH_SIZE = 16  # ANIMEGAN_PHASH_SIZE's default
MAX_DISTANCE = 6  # ANIMEGAN_PHASH_MAX_DISTANCE's default
#: Pictures the rule's numbers were not chosen on: "<photo>/crop" (the centre 75 %, so
#: photos of 512 px and less are no longer reduced to the output) and "<photo>/turn".
HELD_OUT = tuple(f"{name}/{variant}" for name in PHOTOS for variant in ("crop", "turn"))
SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # every tolerance of the rule times these, compared


# -- inputs --------------------------------------------------------------------------------
def photo(name: str) -> Image.Image:
    """A scikit-image photo as RGB; ``"<name>/crop"``: its centre 75 %, ``"<name>/turn"``:
    turned a quarter (HELD_OUT)."""
    name, _, variant = name.partition("/")
    array = getattr(skimage.data, name)()
    if isinstance(array, tuple):
        array = array[0]
    image = Image.fromarray(np.asarray(array)).convert("RGB")
    if variant == "crop":
        width, height = image.size
        return image.crop((width // 8, height // 8, width - width // 8, height - height // 8))
    if variant == "turn":
        return image.transpose(Image.Transpose.ROTATE_90)
    if variant:
        raise ValueError(f"unknown variant {variant!r} of {name}")
    return image


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


_DECODER = Decoder(limits=DecodeLimits(max_pixels=10**8), isolation="thread", timeout=30,
                   slots=1, max_queue=0, queue_timeout=30)


def upload(data: bytes, size: int) -> DecodedUpload:
    """The upload as the service decodes it: fitted to ``size``, with its own size and
    JPEG step (what the service fingerprints)."""
    return _DECODER.decode(data, size=size)


def fitted(data: bytes, size: int) -> Image.Image:
    """The upload decoded and fitted to ``size``."""
    return upload(data, size).image


def resized(image: Image.Image, factor: float) -> Image.Image:
    return image.resize((round(image.width * factor), round(image.height * factor)),
                        Image.Resampling.LANCZOS)


def _jpeg(quality: int, factor: float = 1.0) -> Callable[[Image.Image], bytes]:
    def copy(image: Image.Image) -> bytes:
        return encode(image if factor == 1 else resized(image, factor), "JPEG", quality=quality)
    return copy


#: How B re-encodes A's photo: (name, function of the photo A uploaded).
REENCODES: dict[str, Callable[[Image.Image], bytes]] = {
    **{f"JPEG q{q}": _jpeg(q) for q in (70, 80, 90, 95)},
    **{f"resize {f}%, JPEG q{q}": _jpeg(q, f / 100) for f in (95, 105) for q in (75, 90)},
}
ORIGINALS = {"from PNG": lambda im: encode(im, "PNG"),
             "from JPEG q90": lambda im: encode(im, "JPEG", quality=90)}


# -- local edits (on the photo at its own resolution) ----------------------------------------
Box = tuple[int, int, int, int]


def edit_box(image: Image.Image, area: float, rng: random.Random, place: str) -> Box:
    """A box of ``area`` of the picture, at a random spot or the most detailed of 40."""
    width = max(1, round(image.width * area ** 0.5))
    height = max(1, round(image.height * area ** 0.5))
    spots = [(rng.randrange(image.width - width + 1), rng.randrange(image.height - height + 1))
             for _ in range(40 if place == "detail" else 1)]
    if place == "detail":
        gray = np.asarray(image.convert("L"), np.float32)
        spots.sort(key=lambda s: float(gray[s[1]:s[1] + height, s[0]:s[0] + width].std()))
        spots = spots[-1:]
    left, top = spots[0]
    return left, top, left + width, top + height


def _side(box: Box) -> int:
    return min(box[2] - box[0], box[3] - box[1])


# Strengths scale with the box, as someone hiding a face scales them (a 1 % box of a
# 512 px photo: blur radius 4-8 px, blocks of 6-13 px), so that an edit of a large photo
# is as visible at the output's scale as one of a small photo.
def blur(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> None:
    """Gaussian blur of radius 8-16 % of the box, its surroundings as context."""
    radius = rng.uniform(0.08, 0.16) * _side(box)
    pad = round(3 * radius)
    outer = (max(0, box[0] - pad), max(0, box[1] - pad),
             min(image.width, box[2] + pad), min(image.height, box[3] + pad))
    blurred = image.crop(outer).filter(ImageFilter.GaussianBlur(radius))
    image.paste(blurred.crop((box[0] - outer[0], box[1] - outer[1],
                              box[2] - outer[0], box[3] - outer[1])), box[:2])


def pixelate(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> None:
    """A mosaic 4-8 blocks across."""
    block = max(2, round(_side(box) / rng.uniform(4, 8)))
    part = image.crop(box)
    small = part.resize((max(1, round(part.width / block)), max(1, round(part.height / block))),
                        Image.Resampling.BOX)
    image.paste(small.resize(part.size, Image.Resampling.NEAREST), box[:2])


def text_box(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> None:
    """Two lines of capitals in a random colour, on a filled box half of the time."""
    part = image.crop(box)
    draw = ImageDraw.Draw(part)
    if rng.random() < 0.5:
        draw.rectangle((0, 0, part.width - 1, part.height - 1),
                       fill=tuple(rng.randrange(256) for _ in range(3)))
    font = ImageFont.load_default(size=max(8, round(part.height * 0.45)))
    colour = tuple(rng.randrange(256) for _ in range(3))
    for line in range(2):
        words = "".join(rng.choice("ABCDEFGHKMNRSTWXZ") for _ in range(3))
        draw.text((2, 2 + line * part.height // 2), words, fill=colour, font=font)
    image.paste(part, box[:2])


def paste(image: Image.Image, box: Box, rng: random.Random, donor: Image.Image) -> None:
    """A patch copied from elsewhere in the photo, or from another photo."""
    width, height = box[2] - box[0], box[3] - box[1]
    source = image.copy() if rng.random() < 0.5 else donor.resize(image.size)
    left, top = rng.randrange(source.width - width + 1), rng.randrange(source.height - height + 1)
    image.paste(source.crop((left, top, left + width, top + height)), box[:2])


EDITS: dict[str, Callable[[Image.Image, Box, random.Random, Image.Image], None]] = {
    "blur": blur, "pixelate": pixelate, "text box": text_box, "paste": paste}


def edited(image: Image.Image, kind: str, area: float, place: str, rng: random.Random,
           donor: Image.Image) -> tuple[Image.Image, Box]:
    copy = image.copy()
    box = edit_box(copy, area, rng, place)
    EDITS[kind](copy, box, rng, donor)
    return copy, box


# -- trials --------------------------------------------------------------------------------
def cache() -> NearDuplicateCache:
    return NearDuplicateCache(MemoryStorage(10**8), ttl=3600, hash_size=HASH_SIZE,
                              max_distance=MAX_DISTANCE, index_cap=INDEX_CAP)


def hits(stored: Fingerprint, asked: Fingerprint, *, both_ways: bool = True,
         asked_scope: str = "A") -> bool:
    """Whether a cache holding ``stored`` (from client A) answers ``asked`` (from
    ``asked_scope``), or, ``both_ways``, one holding ``asked`` answers ``stored``."""
    for first, second in ((stored, asked), (asked, stored))[:2 if both_ways else 1]:
        store = cache()
        store.put(("A", "style", 512, "jpeg"), first, b"A's result", (1, 1))
        if store.get((asked_scope, "style", 512, "jpeg"), second):
            return True
    return False


def fingerprint(data: bytes, size: int) -> Fingerprint:
    """The upload's fingerprint, as the service takes it (from its samples)."""
    sampled = _DECODER.sample(data, size=size)
    return Fingerprint.of(sampled.samples, HASH_SIZE, size=fitted_size(sampled.source_size, size),
                          source=sampled.source_size, jpeg_tables=sampled.jpeg_tables)


def image_print(store: NearDuplicateCache, image: Image.Image) -> Fingerprint:
    """The fingerprint of a picture in memory, as if uploaded losslessly at its size."""
    return store.fingerprint(of_picture(image), size=image.size)


def near(a: Fingerprint, b: Fingerprint) -> bool:
    """Whether the rule's other two conditions (phash, aspect) hold."""
    return (a.distance(b) <= MAX_DISTANCE
            and abs(b.aspect / a.aspect - 1) <= ASPECT_TOLERANCE)


@dataclass(frozen=True)
class Trial:
    group: str  # "re-encode", "edit" or "other client"
    kind: str
    size: int
    photo: str
    hit: bool
    excess: float  # the grids' largest difference over what the rule allows (<= 1: within)
    near: bool  # whether the phash and aspect conditions hold (the hit at any tolerance)
    change: float = 0.0  # edits: mean absolute change over the box, fitted (levels)
    area: float = 0.0
    place: str = ""


def reencode_trials(photos: Sequence[str], sizes: Sequence[int]) -> list[Trial]:
    trials = []
    for name in photos:
        image = photo(name)
        for origin, make in ORIGINALS.items():
            original = make(image)
            uploaded = decoded(original)
            for size in sizes:
                first = fingerprint(original, size)
                for kind, copy in REENCODES.items():
                    second = fingerprint(copy(uploaded), size)
                    trials.append(Trial("re-encode", f"{kind} ({origin})", size, name,
                                        hits(first, second, both_ways=False),
                                        first.excess(second),
                                        near(first, second)))
                    if kind == "JPEG q90":  # the same photo, asked by another client
                        trials.append(Trial("other client", "JPEG q90", size, name,
                                            hits(first, second, asked_scope="B"), 0, False))
    return trials


def edit_trials(photos: Sequence[str], sizes: Sequence[int], seeds: Sequence[int],
                saved: Sequence[str] = ("JPEG",)) -> list[Trial]:
    trials = []
    for index, name in enumerate(photos):
        original = encode(photo(name), "JPEG", quality=90)
        image, donor = decoded(original), photo(photos[(index + 1) % len(photos)])
        for size in sizes:
            first_upload = upload(original, size)
            first, first_print = first_upload.image, fingerprint(original, size)
            scale = first.width / image.width
            for area in AREAS:
                for place in PLACES:
                    for seed in seeds:
                        for kind in EDITS:
                            rng = random.Random(f"{seed}/{name}/{size}/{kind}/{area}/{place}")
                            copy, box = edited(image, kind, area, place, rng, donor)
                            for fmt in saved:
                                data = (encode(copy, "JPEG", quality=90) if fmt == "JPEG"
                                        else encode(copy, "PNG"))
                                second_upload = upload(data, size)
                                second = second_upload.image
                                second_print = fingerprint(data, size)
                                fitted_box = tuple(round(v * scale) for v in box)
                                change = float(np.abs(
                                    np.asarray(first.crop(fitted_box), np.float32)
                                    - np.asarray(second.crop(fitted_box), np.float32)).mean())
                                trials.append(Trial(
                                    "edit", kind, size, name, hits(first_print, second_print),
                                    first_print.excess(second_print),
                                    near(first_print, second_print), change, area, place))
    return trials


# -- sizes and times -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_uri() -> Iterator[str | None]:
    """A throwaway redis-server on a free loopback port, or None if none is installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    import redis

    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--dir", folder],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    redis.Redis(port=port).ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.terminate()
            server.wait(10)


class CountingStorage(Storage):
    """Another storage, counting the bytes each lookup reads and its round trips."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.max_bytes = inner.max_bytes
        self.read = 0
        self.trips = 0

    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        self.read += len(value or b"")
        self.trips += 1
        return value

    def set(self, key: str, value: bytes, ttl: float) -> bool:
        self.trips += 1
        return self.inner.set(key, value, ttl)

    def index(self, name: str, limit: int) -> list[bytes]:
        members = self.inner.index(name, limit)
        self.read += sum(len(m) for m in members)
        self.trips += 1
        return members

    def set_indexed(self, key: str, value: bytes, *, index: str, member: bytes,
                    ttl: float, cap: int) -> bool:
        self.trips += 1
        return self.inner.set_indexed(key, value, index=index, member=member, ttl=ttl, cap=cap)

    def status(self) -> dict[str, Any]:
        return self.inner.status()


def footprint(storage: Storage, size: int = 512, client: Any = None) -> dict[str, Any]:
    """Fill one namespace with ``INDEX_CAP`` distinct photos, then look one up: the bytes
    read and round trips of a hit and of a miss, and (with a Redis ``client``) the
    ``MEMORY USAGE`` of an entry beside its result and of the index per member."""
    counting = CountingStorage(storage)
    store = NearDuplicateCache(counting, ttl=3600, hash_size=HASH_SIZE,
                               max_distance=MAX_DISTANCE, index_cap=INDEX_CAP)
    namespace = ("client", "style", size, "jpeg")
    base = fitted(encode(photo("astronaut"), "PNG"), size)
    result = encode(base, "JPEG", quality=90)  # stands for the converted picture
    images = [base.rotate(angle) for angle in range(0, 360, 360 // INDEX_CAP)][:INDEX_CAP]
    for image in images:
        store.put(namespace, image_print(store, image), result, image.size)
    figures: dict[str, Any] = {"result_bytes": len(result)}
    for label, asked in (("hit", fingerprint(encode(images[-1], "JPEG", quality=85), size)),
                         ("miss", image_print(store, base.transpose(
                             Image.Transpose.FLIP_LEFT_RIGHT)))):
        counting.read = counting.trips = 0
        found = store.get(namespace, asked)
        figures[f"{label}_found"] = found is not None
        figures[f"{label}_read_bytes"] = counting.read
        figures[f"{label}_trips"] = counting.trips
    figures["index_read_bytes"] = figures["miss_read_bytes"]
    if client is not None:
        keys = [key.decode() for key in client.keys("*")]
        entries = [k for k in keys if ":entry:" in k or k.startswith("entry:")]
        index = [k for k in keys if "index:" in k]
        figures["redis_entry_bytes"] = max(int(client.memory_usage(k) or 0) for k in entries)
        figures["redis_entry_over_result"] = figures["redis_entry_bytes"] - len(result)
        figures["redis_index_bytes"] = int(client.memory_usage(index[0]) or 0)
        figures["redis_entry_total_over_result"] = (figures["redis_entry_over_result"]
                                                    + figures["redis_index_bytes"] // INDEX_CAP)
    else:
        figures["memory_entry_over_result"] = _memory_entry_cost(size, result)
    return figures


def _memory_entry_cost(size: int, result: bytes) -> int:
    """Bytes a ``MemoryStorage`` counts for one entry beyond its result (entry + member)."""
    storage = MemoryStorage(10**8)
    store = NearDuplicateCache(storage, ttl=3600, hash_size=HASH_SIZE, index_cap=INDEX_CAP)
    image = fitted(encode(photo("coffee"), "PNG"), size)
    store.put(("a",), image_print(store, image), result, image.size)
    return int(storage.status()["bytes"]) - len(result)


def timings(size: int = 512, repeats: int = 30) -> dict[str, float]:
    """Milliseconds to sample a re-encoded copy (decode and resample, in this thread), to
    fingerprint its samples and to look it up in a full index."""
    store = NearDuplicateCache(MemoryStorage(10**8), ttl=3600, hash_size=HASH_SIZE,
                               max_distance=MAX_DISTANCE, index_cap=INDEX_CAP)
    base = fitted(encode(photo("astronaut"), "PNG"), size)
    for angle in range(0, 360, 360 // INDEX_CAP):
        image = base.rotate(angle)
        store.put(("n",), image_print(store, image), b"x" * 50_000, image.size)
    data = encode(base, "JPEG", quality=85)
    started = time.perf_counter()
    for _ in range(repeats):
        sampled = _DECODER.sample(data, size=size)
    sample_ms = (time.perf_counter() - started) / repeats * 1000
    fitted_to = fitted_size(sampled.source_size, size)
    started = time.perf_counter()
    for _ in range(repeats):
        fingerprint = store.fingerprint(sampled.samples, size=fitted_to,
                                        source=sampled.source_size,
                                        jpeg_tables=sampled.jpeg_tables)
    fingerprint_ms = (time.perf_counter() - started) / repeats * 1000
    started = time.perf_counter()
    for _ in range(repeats):
        store.get(("n",), fingerprint)
    lookup_ms = (time.perf_counter() - started) / repeats * 1000
    return {"size": size, "sample_ms": sample_ms, "fingerprint_ms": fingerprint_ms,
            "lookup_ms": lookup_ms, "hit_ms": sample_ms + fingerprint_ms + lookup_ms}


# -- the whole measure -------------------------------------------------------------------------
def measure(quick: bool = False, inference_ms: float | None = None,
            inference_size: int | None = None) -> dict[str, Any]:
    """Every figure, as JSON for ``python -m bench``; ``inference_ms``: the engine's time
    for one picture of ``inference_size`` (from the stages section), to compare with."""
    photos = QUICK_PHOTOS if quick else PHOTOS
    seeds = range(1 if quick else 2)
    trials = reencode_trials(photos, SIZES) + edit_trials(photos, SIZES, seeds)
    results: dict[str, Any] = {
        "rule": {**{name: getattr(rule, name) for name in (
            "FINE_SIDE", "COARSE_SIDE", "DETAIL_SHARE", "DETAIL_LEVELS", "ASPECT_TOLERANCE",
            "SAME_JPEG_SHARE")},
            **{f"{name} {field}": getattr(getattr(rule, name), field)
               for name in ("SAME_SIZE", "OTHER_SIZE")
               for field in ("mean_levels", "mean_per_deviation", "colour_levels")}},
        "photos": len(photos), "seeds": len(seeds)}
    group = _groups(trials)
    results.update(summary(trials))
    results["reencode"] = {kind: _rate([t for t in group["re-encode"] if t.kind == kind])
                           for kind in sorted({t.kind for t in group["re-encode"]})}
    edits = group["edit"]
    visible = _visible(edits)
    results["edits"] = {
        f"{kind}, {area:.0%}, {place}": _rate([t for t in edits if t.kind == kind
                                               and t.area == area and t.place == place])
        for kind in EDITS for area in AREAS for place in PLACES}
    results["scales"] = scale_table(trials)
    results["reencode_excess"] = _quantiles([t.excess for t in group["re-encode"]])
    results["edit_excess"] = _quantiles([t.excess for t in visible])
    if not quick:
        held = reencode_trials(HELD_OUT, SIZES) + edit_trials(HELD_OUT, SIZES, seeds[:1])
        results["held_out"] = {"photos": len(HELD_OUT), **summary(held),
                               "scales": scale_table(held)}
    results["memory"] = footprint(MemoryStorage(10**8))
    with redis_uri() as uri:
        if uri is not None:
            import redis

            from flask_animegan.cache.storage import open_storage

            results["redis"] = footprint(open_storage(uri, max_bytes=0, prefix="bench:"),
                                         client=redis.Redis.from_url(uri))
    results["times"] = timings(inference_size or 512)
    if inference_ms:
        results["inference_ms"] = inference_ms
        results["inference_size"] = inference_size
        results["hit_vs_inference"] = results["times"]["hit_ms"] / inference_ms
    return results


def _visible(edits: Sequence[Trial]) -> list[Trial]:
    """The edits that changed their box by VISIBLE levels or more on average."""
    return [t for t in edits if t.change >= VISIBLE]


def _groups(trials: Sequence[Trial]) -> dict[str, list[Trial]]:
    group: dict[str, list[Trial]] = defaultdict(list)
    for t in trials:
        group[t.group].append(t)
    return group


def summary(trials: Sequence[Trial]) -> dict[str, Any]:
    """The figures the acceptance names, over ``trials``: re-encodes that hit, another
    client's hits, edits (and visible ones, by placement) that hit, and those listed."""
    group = _groups(trials)
    edits = group["edit"]
    visible = _visible(edits)
    return {
        "reencode_hit_share": _share(group["re-encode"]),
        "reencode_trials": len(group["re-encode"]),
        "other_client_hits": sum(t.hit for t in group["other client"]),
        "other_client_trials": len(group["other client"]),
        "edit_hits": sum(t.hit for t in edits), "edit_trials": len(edits),
        "visible_edit_hits": sum(t.hit for t in visible),
        "visible_edit_trials": len(visible),
        **{f"visible_{place}_edit_hits": sum(t.hit for t in visible if t.place == place)
           for place in PLACES},
        "edit_hits_listed": [
            f"{t.kind} {t.area:.0%} {t.place} @ {t.size} px, {t.photo}: box changed by "
            f"{t.change:.1f} levels, grid excess {t.excess:.2f}"
            for t in edits if t.hit],
    }


def scale_table(trials: Sequence[Trial]) -> dict[str, dict[str, float]]:
    """What the rule with every tolerance times k would give on ``trials``."""
    group = _groups(trials)
    edits = group["edit"]
    visible = _visible(edits)
    return {str(k): {"reencode_hit_share": _share([replace(t, hit=t.near and t.excess <= k)
                                                   for t in group["re-encode"]]),
                     **{f"{place}_edit_hits": sum(t.near and t.excess <= k for t in edits
                                                  if t.place == place) for place in PLACES},
                     "visible_edit_hits": sum(t.near and t.excess <= k for t in visible)}
            for k in SCALES}


def _rate(trials: Sequence[Trial]) -> str:
    return f"{sum(t.hit for t in trials)}/{len(trials)}"


def _share(trials: Sequence[Trial]) -> float:
    return sum(t.hit for t in trials) / len(trials) if trials else float("nan")


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {name: float(np.quantile(values, q)) for name, q in
            (("min", 0), ("p5", .05), ("median", .5), ("p95", .95), ("max", 1))}


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _scale_rows(scales: dict[str, dict[str, float]], visible_trials: int) -> str:
    return _table(["k", "re-encodes hit", "edits on detail hit", "edits at random hit",
                   f"visible edits hit (of {visible_trials})"],
                  [[n, f"{row['reencode_hit_share']:.1%}", row["detail_edit_hits"],
                    row["random_edit_hits"], row["visible_edit_hits"]]
                   for n, row in scales.items()])


def render(results: dict[str, Any]) -> str:
    """The figures as markdown."""
    r = results
    out = [
        ("Rule: " + ", ".join(f"{k} {v:g}" for k, v in r["rule"].items())
         + f"; {r['photos']} photos, 256 and 512 px, {r['seeds']} seed(s)"), "",
        f"Same photo re-encoded (should hit): {r['reencode_hit_share']:.1%}", "",
        _table(["copy", "hits"], [[k, v] for k, v in r["reencode"].items()]), "",
        (f"Another client asking for the same photo: {r['other_client_hits']}/"
         f"{r['other_client_trials']} hits"), "",
        (f"Local edits (should miss): {r['edit_hits']}/{r['edit_trials']} hit; visible (box "
         f"changed >= {VISIBLE} levels): {r['visible_edit_hits']}/{r['visible_edit_trials']} "
         f"(placed on detail {r['visible_detail_edit_hits']}, at random "
         f"{r['visible_random_edit_hits']})"), "",
        _table(["edit, area, placed", "hits"], [[k, v] for k, v in r["edits"].items()]), "",
        ("Grid excess (1 = what the rule allows), re-encodes: "
         + ", ".join(f"{k} {v:.2f}" for k, v in r["reencode_excess"].items())
         + "; visible edits: "
         + ", ".join(f"{k} {v:.2f}" for k, v in r["edit_excess"].items())), "",
    ]
    out += ["Every tolerance times k (the same trials):", "", _scale_rows(r["scales"],
                                                                      r["visible_edit_trials"]), ""]
    out += [f"- {line}" for line in results["edit_hits_listed"]]
    if "held_out" in results:
        h = results["held_out"]
        out += ["", (f"Held out ({h['photos']} pictures the numbers were not chosen on: a centre "
                     f"crop and a quarter turn of each photo): re-encodes hit "
                     f"{h['reencode_hit_share']:.1%} of {h['reencode_trials']}; another client "
                     f"{h['other_client_hits']}/{h['other_client_trials']}; visible edits "
                     f"{h['visible_edit_hits']}/{h['visible_edit_trials']} (on detail "
                     f"{h['visible_detail_edit_hits']}, at random "
                     f"{h['visible_random_edit_hits']})"), "",
                _scale_rows(h["scales"], h["visible_edit_trials"]), ""]
        out += [f"- held out: {line}" for line in h["edit_hits_listed"]]
    for backend in ("memory", "redis"):
        if backend in results:
            f = results[backend]
            out.append(f"- {backend}: lookup reads {f['index_read_bytes'] / 1024:.1f} KiB "
                       f"(a miss, {f['miss_trips']} round trip), a hit "
                       f"{f['hit_read_bytes'] / 1024:.1f} KiB ({f['hit_trips']} round trips); "
                       + (f"MEMORY USAGE: entry = result + {f['redis_entry_over_result']} B, "
                          f"index {f['redis_index_bytes']} B for {INDEX_CAP} members: "
                          f"result + {f['redis_entry_total_over_result']} B per entry"
                          if backend == "redis" else
                          f"an entry counts result + {f['memory_entry_over_result']} B"))
    t = results["times"]
    out.append(f"- at {t['size']} px: statistics of a JPEG copy (decode and sample, in this "
               f"thread) {t['sample_ms']:.2f} ms, fingerprint {t['fingerprint_ms']:.2f} ms, "
               f"lookup in a full index {t['lookup_ms']:.2f} ms"
               + (f"; vs inference at {results['inference_size']} px "
                  f"({results['inference_ms']:.0f} ms): {results['hit_vs_inference']:.4f}"
                  if "hit_vs_inference" in results else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache_rule",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 photos, one seed")
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(render(measure(args.quick)))
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
