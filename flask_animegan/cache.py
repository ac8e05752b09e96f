"""In-memory stores: the near-duplicate result cache and the result pages' store.

Both are cachetools TTL caches bounded in bytes (least recently used first out),
guarded by a lock because gunicorn's threads share them.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import imagehash
import numpy as np
from cachetools import TTLCache
from PIL import Image
from scipy.ndimage import uniform_filter

from .errors import ImageTooLarge

THUMB_SIDE = 16
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo
_ENTRY_OVERHEAD = 256  # rough bytes of bookkeeping per entry


@dataclass(frozen=True)
class Fingerprint:
    """What decides whether two inputs are the same photo."""

    phash: int
    thumbnail: np.ndarray  # THUMB_SIDE x THUMB_SIDE x 3 float32, 0-255
    aspect: float

    @classmethod
    def of(cls, image: Image.Image, hash_size: int) -> Fingerprint:
        digest = imagehash.phash(image, hash_size=hash_size)
        bits = np.packbits(digest.hash.flatten())
        # box-average to 4x the side in uint8, then to the side in float: rounding
        # to whole levels would otherwise swamp the small shifts we must detect
        fine = np.asarray(image.resize((THUMB_SIDE * 4,) * 2, Image.Resampling.BOX), np.float32)
        thumb = fine.reshape(THUMB_SIDE, 4, THUMB_SIDE, 4, 3).mean(axis=(1, 3))
        return cls(int.from_bytes(bits.tobytes(), "big"), thumb, image.width / image.height)

    def distance(self, other: Fingerprint) -> int:
        return (self.phash ^ other.phash).bit_count()

    def same_colors(self, other: Fingerprint, tolerance: float) -> bool:
        """Whether the colour thumbnails match within ``tolerance`` (0-255 levels).

        Re-encoding or resizing a photo adds small, high-frequency differences; editing
        it (brightness, hue, recolouring) shifts colours systematically or changes whole
        regions. So the difference map is first smoothed over 3x3 cells (which removes
        resampling noise but keeps regional changes), then: its mean absolute value must
        be at most ``tolerance``, each channel's mean signed shift at most a third of it,
        and no cell may differ by more than five times it.
        """
        diff = uniform_filter(self.thumbnail - other.thumbnail, size=(3, 3, 1), mode="nearest")
        return bool(np.abs(diff).mean() <= tolerance
                    and np.abs(diff.reshape(-1, 3).mean(axis=0)).max() <= tolerance / 3
                    and np.abs(diff).max() <= tolerance * 5)


@dataclass(frozen=True)
class CachedResult:
    fingerprint: Fingerprint
    data: bytes
    size: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.fingerprint.thumbnail.nbytes + _ENTRY_OVERHEAD


class NearDuplicateCache:
    """Results keyed by (namespace, perceptual hash), shared only between near-identical inputs.

    A lookup hits when the phash distance is within ``max_distance`` AND the colour
    thumbnails differ by at most ``color_tolerance`` AND the aspect ratios match:
    the grayscale phash alone cannot tell a photo from its hue-shifted copy.
    """

    def __init__(self, *, max_bytes: int, ttl: float, hash_size: int = 16,
                 max_distance: int = 6, color_tolerance: float = 0.9,
                 timer: Any = time.monotonic) -> None:
        self.enabled = ttl > 0 and max_bytes > 0
        self.hash_size = hash_size
        self.max_distance = max_distance
        self.color_tolerance = color_tolerance
        self._entries: TTLCache = TTLCache(maxsize=max(max_bytes, 1), ttl=max(ttl, 1e-9),
                                           timer=timer, getsizeof=lambda e: e.nbytes)
        self._lock = threading.Lock()
        self._serial = 0
        self.hits = 0
        self.misses = 0

    def fingerprint(self, image: Image.Image) -> Fingerprint:
        return Fingerprint.of(image, self.hash_size)

    def get(self, namespace: tuple, fingerprint: Fingerprint) -> CachedResult | None:
        if not self.enabled:
            return None
        with self._lock:
            best_key, best_distance = None, self.max_distance + 1
            for key, entry in self._entries.items():
                if key[0] != namespace:
                    continue
                distance = fingerprint.distance(entry.fingerprint)
                if (distance < best_distance
                        and abs(entry.fingerprint.aspect / fingerprint.aspect - 1) <= ASPECT_TOLERANCE
                        and fingerprint.same_colors(entry.fingerprint, self.color_tolerance)):
                    best_key, best_distance = key, distance
            if best_key is None:
                self.misses += 1
                return None
            self.hits += 1
            return self._entries[best_key]  # indexing refreshes its LRU position

    def put(self, namespace: tuple, fingerprint: Fingerprint, data: bytes,
            size: tuple[int, int]) -> None:
        if not self.enabled:
            return
        entry = CachedResult(fingerprint, data, size)
        if entry.nbytes > self._entries.maxsize:
            return
        with self._lock:
            self._serial += 1
            self._entries[(namespace, self._serial)] = entry

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._entries.expire()
            return {"enabled": self.enabled, "entries": len(self._entries),
                    "bytes": self._entries.currsize, "max_bytes": self._entries.maxsize,
                    "hits": self.hits, "misses": self.misses}


@dataclass(frozen=True)
class StoredResult:
    original: bytes  # JPEG of the (fitted) input, shown beside the result
    result: bytes
    mimetype: str
    style: str
    size: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return len(self.original) + len(self.result) + _ENTRY_OVERHEAD


class ResultStore:
    """Results of form uploads for the post/redirect/get page, under unguessable ids."""

    def __init__(self, *, max_bytes: int, ttl: float, timer: Any = time.monotonic) -> None:
        self._entries: TTLCache = TTLCache(maxsize=max_bytes, ttl=ttl, timer=timer,
                                           getsizeof=lambda e: e.nbytes)
        self._lock = threading.Lock()

    def add(self, result: StoredResult) -> str:
        if result.nbytes > self._entries.maxsize:
            raise ImageTooLarge("the result is too large to keep for its page; choose a "
                                "smaller size or raise ANIMEGAN_RESULT_MAX_BYTES")
        token = secrets.token_urlsafe(24)  # 192 bits
        with self._lock:
            self._entries[token] = result
        return token

    def get(self, token: str) -> StoredResult | None:
        with self._lock:
            return self._entries.get(token)
