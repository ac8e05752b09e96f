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
from scipy.ndimage import sobel, uniform_filter

from .errors import ImageTooLarge

THUMB_SIDE = 16
ASPECT_TOLERANCE = 0.02  # relative; a crop of a photo is a different photo
_ENTRY_OVERHEAD = 256  # rough bytes of bookkeeping per entry

# The local check compares fixed grids, whatever the input's size, so that resized
# copies line up cell for cell: luma at 128x128 (2-4 output pixels a cell at 256-512)
# and colour at 64x64 (JPEG keeps colour at half resolution anyway). Windows of 6 and
# 3 cells (4.7 % of a side) fit whole inside a 10 % x 10 % edit. bench/cache_privacy.py
# measured these choices; change them only with it.
LUMA_SIDE = 128
LUMA_WINDOW = 6
CHROMA_SIDE = 64
CHROMA_WINDOW = 3
LUMA_FLOOR = 0.75  # levels a window of a flat region may differ by (re-encoding noise)
CHROMA_FLOOR = 6.0  # the same for Cb + Cr, which JPEG quantises much more coarsely
NOISE_QUANTILE = 0.75  # which window sets a pair's "re-encoding noise per unit of detail"


@dataclass(frozen=True)
class Fingerprint:
    """What decides whether two inputs are the same photo."""

    phash: int
    thumbnail: np.ndarray  # THUMB_SIDE x THUMB_SIDE x 3 float32, 0-255
    aspect: float
    luma: np.ndarray  # LUMA_SIDE x LUMA_SIDE uint8 (Y of YCbCr)
    chroma: np.ndarray  # CHROMA_SIDE x CHROMA_SIDE x 2 uint8 (Cb, Cr)

    @classmethod
    def of(cls, image: Image.Image, hash_size: int) -> Fingerprint:
        digest = imagehash.phash(image, hash_size=hash_size)
        bits = np.packbits(digest.hash.flatten())
        # box-average to 4x the side in uint8, then to the side in float: rounding
        # to whole levels would otherwise swamp the small shifts we must detect
        fine = np.asarray(image.resize((THUMB_SIDE * 4,) * 2, Image.Resampling.BOX), np.float32)
        thumb = fine.reshape(THUMB_SIDE, 4, THUMB_SIDE, 4, 3).mean(axis=(1, 3))
        grid = np.asarray(image.convert("YCbCr").resize((LUMA_SIDE,) * 2,
                                                         Image.Resampling.LANCZOS))
        step = LUMA_SIDE // CHROMA_SIDE
        chroma = grid[..., 1:].reshape(CHROMA_SIDE, step, CHROMA_SIDE, step, 2).mean(axis=(1, 3))
        return cls(int.from_bytes(bits.tobytes(), "big"), thumb, image.width / image.height,
                   np.ascontiguousarray(grid[..., 0]), chroma.round().astype(np.uint8))

    @property
    def nbytes(self) -> int:
        return self.thumbnail.nbytes + self.luma.nbytes + self.chroma.nbytes

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

    def local_difference(self, other: Fingerprint) -> float:
        """How much the most changed small window differs, in units of this pair's noise.

        The 16x16 thumbnail cannot see a blurred, pixelated, covered or pasted patch of
        1 % of the image: the photo around it still matches. So luma and colour are
        compared window by window, and one window is enough to tell the inputs apart.
        Re-encoding and resizing change every window a little, in proportion to its
        detail (edges move by a fraction of a pixel, JPEG rounds fine texture); how much
        per unit of detail is measured on the pair itself, so a window counts only by
        how far it exceeds what this pair's own noise explains there. A typical window
        scores about 1; a blurred, pixelated, covered or replaced one several times more.
        Symmetric, so a planted doctored copy is told apart as well as a doctored query.
        """
        luma = self._window_excess(self.luma, other.luma, LUMA_WINDOW, LUMA_FLOOR)
        chroma = self._window_excess(self.chroma, other.chroma, CHROMA_WINDOW, CHROMA_FLOOR)
        return max(luma, chroma)

    @staticmethod
    def _window_excess(a: np.ndarray, b: np.ndarray, window: int, floor: float) -> float:
        """Largest ratio, over windows, of the difference to ``floor`` + noise gain x detail."""
        a = a.reshape(*a.shape[:2], -1).astype(np.float32)
        b = b.reshape(*b.shape[:2], -1).astype(np.float32)
        b += np.median((a - b).reshape(-1, a.shape[2]), axis=0)  # a global offset is not local
        diff = uniform_filter(np.abs(a - b).sum(axis=2), window, mode="nearest")
        # detail that both share: a blurred patch has none, so it is not excused by its original's
        detail = uniform_filter(np.minimum(Fingerprint._gradient(a), Fingerprint._gradient(b)),
                                window, mode="nearest")
        gain = np.quantile(diff / (detail + floor), NOISE_QUANTILE)
        return float((diff / (gain * detail + floor)).max())

    @staticmethod
    def _gradient(channels: np.ndarray) -> np.ndarray:
        """Sum over channels of the Sobel gradient magnitude, in levels per cell."""
        total = np.zeros(channels.shape[:2], np.float32)
        for c in range(channels.shape[2]):
            plane = channels[..., c]
            total += np.hypot(sobel(plane, 0, mode="nearest"), sobel(plane, 1, mode="nearest")) / 8
        return total

    def same_locally(self, other: Fingerprint, tolerance: float) -> bool:
        """Whether no window differs by more than ``tolerance`` times this pair's noise."""
        return self.local_difference(other) <= tolerance


@dataclass(frozen=True)
class CachedResult:
    fingerprint: Fingerprint
    data: bytes
    size: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.fingerprint.nbytes + _ENTRY_OVERHEAD


class NearDuplicateCache:
    """Results keyed by (namespace, perceptual hash), shared only between near-identical inputs.

    A lookup hits when the phash distance is within ``max_distance``, the aspect
    ratios match, the colour thumbnails differ by at most ``color_tolerance`` (the
    grayscale phash alone cannot tell a photo from its hue-shifted copy) AND no small
    window differs by more than ``local_tolerance`` times the pair's re-encoding noise
    (the checks before it let a blurred or pixelated face through: the photo around
    it still matches).
    """

    def __init__(self, *, max_bytes: int, ttl: float, hash_size: int = 16,
                 max_distance: int = 6, color_tolerance: float = 0.9,
                 local_tolerance: float = 1.75, timer: Any = time.monotonic) -> None:
        self.enabled = ttl > 0 and max_bytes > 0
        self.hash_size = hash_size
        self.max_distance = max_distance
        self.color_tolerance = color_tolerance
        self.local_tolerance = local_tolerance
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
            near = []
            for key, entry in self._entries.items():
                if key[0] != namespace:
                    continue
                other = entry.fingerprint
                distance = fingerprint.distance(other)
                if (distance <= self.max_distance
                        and abs(other.aspect / fingerprint.aspect - 1) <= ASPECT_TOLERANCE
                        and fingerprint.same_colors(other, self.color_tolerance)):
                    near.append((distance, key, other))
            # the local check costs ~2 ms, so it runs last, closest candidate first
            for _, key, other in sorted(near, key=lambda found: found[0]):
                if fingerprint.same_locally(other, self.local_tolerance):
                    self.hits += 1
                    return self._entries[key]  # indexing refreshes its LRU position
            self.misses += 1
            return None

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
