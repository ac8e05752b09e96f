"""Section 5: what a cache hit costs against a miss, through ours with the cache on.

Two kinds of hit: the same file sent again (answered from the index before any decode),
and a re-encoded copy of the photo (decoded, fingerprinted and matched by the rule)."""

from __future__ import annotations

import io
import statistics
import time
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from . import servers
from .clients import post_photo
from .inputs import Weights, jpeg
from .service import ours_env
from .timing import median, ratio, time_runs

#: Same-sized variants of the photo that the cache must not confuse with each other,
#: so every miss runs the same network shape (no first-shape cost in a miss).
VARIANTS = (lambda im: im, ImageOps.mirror, ImageOps.flip, lambda im: im.rotate(180),
            ImageOps.invert)


def timed_post(url: str, data: bytes) -> tuple[float, str]:
    """Seconds for one conversion and its X-Cache header; raise on a non-200 answer."""
    started = time.perf_counter()
    response = post_photo(url, data, timeout=600)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"cache run: HTTP {response.status_code}: {response.text[:300]}")
    return seconds, response.headers.get("X-Cache", "")


def bare_decode_s(data: bytes, runs: int = 20) -> float:
    """Median seconds for Pillow alone to decode ``data`` at full size, in this process."""
    def decode() -> None:
        with Image.open(io.BytesIO(data)) as image:
            image.load()

    return statistics.median(time_runs(decode, runs=runs))


def measure(weights: Weights, image: Image.Image, *, size: int, repeats: int,
            log_dir: Path) -> dict[str, Any]:
    """Per variant: a miss (JPEG q90), a hit by the same file sent again, and a hit by the
    same photo re-encoded at q85; and the floor of any hit that decodes the copy."""
    env = ours_env(weights, ANIMEGAN_CACHE_TTL="3600")
    misses, again, copies, headers = [], [], [], []
    with servers.ours("ours-cache", env, log_dir) as server:
        url = f"{server.url}/animegan/convert?size={size}"
        timed_post(url, jpeg(VARIANTS[-1](image), 90))  # warm-up for this shape
        for variant in VARIANTS[:repeats]:
            photo = variant(image)
            sent = jpeg(photo, 90)
            miss_s, miss_header = timed_post(url, sent)
            again_s, again_header = timed_post(url, sent)
            copy_s, copy_header = timed_post(url, jpeg(photo, 85))
            misses.append(miss_s)
            again.append(again_s)
            copies.append(copy_s)
            headers.append((miss_header, again_header, copy_header))
        stats = server.health()["cache"]
    decode_s = bare_decode_s(jpeg(image, 85))
    hit_s = median(again)
    return {
        "size": size, "repeats": len(misses), "miss_s": median(misses),
        # no decoded hit can cost less than the request (as sent again) plus Pillow's bare
        # decode of the copy, without any fit, fingerprint or isolation
        "copy_decode_s": decode_s,
        "copy_floor_vs_miss": ratio(hit_s + decode_s if hit_s is not None else None,
                                    median(misses)),
        "hit_s": hit_s, "copy_hit_s": median(copies),
        "hit_vs_miss": ratio(hit_s, median(misses)),
        "copy_hit_vs_miss": ratio(median(copies), median(misses)),
        "misses_confirmed": sum(m == "MISS" for m, _, _ in headers),
        "hits_confirmed": sum(a == "HIT" for _, a, _ in headers),
        "copy_hits_confirmed": sum(c == "HIT" for _, _, c in headers), "server_stats": stats,
    }
