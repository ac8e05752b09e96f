"""The result cache: a result is reused only for the same client's same file or same photo.

The rule (docs/http-api.md): the same namespace (client, style, size, format, colours,
portrait mode), and the same upload (a keyed digest) or a fitted input of the same size
whose 256-bit pHash is within ``max_distance`` bits of the stored one, where no cell of a
16 x 16 grid over it at half size differs by more than :data:`GRID_LEVELS` levels in mean
Y, Cb or Cr or Y's standard deviation. Entries live in memory or Redis under versioned
keys, as explicit structs (never pickle); a member that does not parse is a miss."""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from ..storage import MemoryStorage, Storage

HASH_SIZE = GRID_SIDE = 16  # a 256-bit pHash; a 16 x 16 grid
#: T: the most a cell's statistic may differ, in levels (chosen by bench/cache_rule.py).
GRID_LEVELS = 1.25
_STEPS = 8  # the grid is stored in eighths of a level (uint16)
INDEX_CAP = 11  # members a namespace's index keeps: the candidates of a lookup
VERSION = "v10"  # in every key and magic: another version's entries are never compared
_GRID_BYTES = GRID_SIDE * GRID_SIDE * 4 * 2
_MEMBER = struct.Struct(f"<4sdII{HASH_SIZE ** 2 // 8}s{_GRID_BYTES}s16s16s")
_MEMBER_MAGIC = b"AM10"  # magic, created, fitted width, height, phash, grid, entry id, upload
_ENTRY = struct.Struct("<4sIIiI")  # magic, width, height, faces, length of the result
_ENTRY_MAGIC = b"AE10"
_NO_UPLOAD = bytes(16)


@dataclass(frozen=True)
class Fingerprint:
    """A fitted input as the cache compares it: pHash, fitted size, cell grid."""

    phash: bytes  # HASH_SIZE ** 2 bits
    size: tuple[int, int]  # (0, 0): none (an entry only its upload's digest finds)
    grid: bytes  # per cell: mean Y, Cb, Cr, Y's deviation, in eighths of a level (<u2)

    @classmethod
    def of(cls, fitted: Image.Image) -> Fingerprint:
        """The fingerprint of ``fitted``, the RGB picture the network sees. Its grid is
        taken at half size, where JPEG's finest noise is gone and a blur still shows."""
        import imagehash  # imported on first use: `flask` commands need none of it

        bits = np.packbits(imagehash.phash(fitted, hash_size=HASH_SIZE).hash.flatten())
        half = fitted.reduce(2) if min(fitted.size) >= 2 * GRID_SIDE else fitted
        ycc = np.asarray(half.convert("YCbCr"), np.float32)
        y, cb, cr, y2 = (np.asarray(Image.fromarray(np.ascontiguousarray(plane), "F").resize(
            (GRID_SIDE, GRID_SIDE), Image.Resampling.BOX), np.float64)
            for plane in (ycc[..., 0], ycc[..., 1], ycc[..., 2], ycc[..., 0] ** 2))
        grid = np.stack([y, cb, cr, np.sqrt(np.maximum(y2 - y ** 2, 0))], axis=2)
        return cls(bits.tobytes(), fitted.size, np.rint(grid * _STEPS).astype("<u2").tobytes())

    def distance(self, other: Fingerprint) -> int:
        """Hamming distance between the pHashes."""
        return (int.from_bytes(self.phash, "big") ^ int.from_bytes(other.phash, "big")).bit_count()

    def grid_levels(self, other: Fingerprint) -> float:
        """The largest difference of a cell's statistic between the two, in levels."""
        a, b = np.frombuffer(self.grid, "<u2"), np.frombuffer(other.grid, "<u2")
        return float(np.abs(a.astype(np.int32) - b).max()) / _STEPS

    def same_photo(self, other: Fingerprint, max_distance: int) -> bool:
        """The rule for two fitted inputs (see the module docstring); symmetric."""
        return (self.size == other.size != (0, 0) and self.distance(other) <= max_distance
                and self.grid_levels(other) <= GRID_LEVELS)


_NONE = Fingerprint(bytes(HASH_SIZE ** 2 // 8), (0, 0), bytes(_GRID_BYTES))


class Member(NamedTuple):  # one entry as its namespace's index lists it
    created: float  # Unix time, comparable between instances
    entry_id: bytes  # 16 random bytes naming the entry's key
    fingerprint: Fingerprint
    upload: bytes  # the upload's keyed digest


def encode_member(m: Member) -> bytes:
    f = m.fingerprint
    return _MEMBER.pack(_MEMBER_MAGIC, m.created, *f.size, f.phash, f.grid, m.entry_id, m.upload)


def decode_member(blob: object) -> Member | None:
    """The member in ``blob``, or ``None`` when it is not one of this version (never raises)."""
    if not isinstance(blob, bytes) or len(blob) != _MEMBER.size:
        return None
    magic, created, width, height, phash, grid, entry_id, upload = _MEMBER.unpack(blob)
    if magic != _MEMBER_MAGIC or not math.isfinite(created) or (width == 0) != (height == 0):
        return None
    return Member(created, entry_id, Fingerprint(phash, (width, height), grid), upload)


@dataclass(frozen=True)
class CachedResult:
    data: bytes
    size: tuple[int, int]
    faces: int = -1  # faces portrait mode converted in it; -1: portrait mode did not run


def encode_entry(data: bytes, size: tuple[int, int], faces: int = -1) -> bytes:
    """An entry: its header, then the result."""
    return _ENTRY.pack(_ENTRY_MAGIC, *size, faces, len(data)) + data


def decode_entry(blob: bytes | None) -> CachedResult | None:
    """The result in ``blob``, or ``None`` if there is none or it does not parse."""
    if not isinstance(blob, bytes) or len(blob) < _ENTRY.size:
        return None
    magic, width, height, faces, length = _ENTRY.unpack_from(blob)
    if magic != _ENTRY_MAGIC or _ENTRY.size + length != len(blob) or faces < -1:
        return None
    return CachedResult(blob[_ENTRY.size:], (width, height), faces)


class NearDuplicateCache:
    """Results per namespace, found by upload digest or by :meth:`Fingerprint.same_photo`;
    ``near=False`` finds identical files only. ``key`` (the app's secret) keys the digests."""

    def __init__(self, storage: Storage | None = None, *, ttl: float,
                 max_bytes: int | None = None, max_distance: int = 6,
                 index_cap: int = INDEX_CAP, key: bytes = b"", near: bool = True) -> None:
        if storage is None:
            if max_bytes is None:
                raise TypeError("NearDuplicateCache needs a storage or max_bytes")
            storage = MemoryStorage(max_bytes)
        self.storage, self.ttl, self.index_cap = storage, ttl, index_cap
        self.max_distance, self.near = max_distance, near
        self.enabled = ttl > 0 and index_cap > 0 and storage.max_bytes != 0
        self._key = hashlib.sha256(key).digest() if key else b""  # BLAKE2b keys: <= 64 bytes
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def fingerprint(self, fitted: Image.Image) -> Fingerprint:
        """The fingerprint of the fitted input (what the network sees)."""
        return Fingerprint.of(fitted)

    def upload_digest(self, data: bytes) -> bytes:
        """The upload's keyed digest: without the key it cannot be matched to a known photo."""
        return hashlib.blake2b(data, key=self._key, digest_size=16).digest()

    def lookup(self, namespace: tuple[object, ...]) -> Lookup:
        """The namespace's live index, read once (one storage round trip)."""
        digest = self._digest(namespace)
        blobs = (self.storage.index(f"{VERSION}:index:{digest}", self.index_cap)
                 if self.enabled else [])
        oldest = time.time() - self.ttl  # the index outlives its older entries
        members = [m for m in map(decode_member, blobs) if m is not None and m.created >= oldest]
        return Lookup(self, digest, members)  # newest first

    def put(self, namespace: tuple[object, ...], fingerprint: Fingerprint | None, data: bytes,
            size: tuple[int, int], faces: int = -1, upload: bytes = _NO_UPLOAD) -> None:
        """Keep ``data`` (``size`` pixels, ``faces`` converted in portrait mode) for the
        upload of digest ``upload`` and, unless None, the photo of ``fingerprint``."""
        if not self.enabled:
            return
        digest = self._digest(namespace)
        member = Member(time.time(), secrets.token_bytes(16), fingerprint or _NONE, upload)
        self.storage.set_indexed(f"{VERSION}:entry:{digest}:{member.entry_id.hex()}",
                                 encode_entry(data, size, faces), index=f"{VERSION}:index:{digest}",
                                 member=encode_member(member), ttl=self.ttl, cap=self.index_cap)

    def stats(self) -> dict[str, Any]:
        """Hits and misses of this process, and the storage's status (no round trip)."""
        return {"enabled": self.enabled, "hits": self.hits, "misses": self.misses,
                **self.storage.status()}

    def _count(self, found: CachedResult | None) -> CachedResult | None:
        with self._lock:
            self.hits, self.misses = self.hits + bool(found), self.misses + (not found)
        return found

    def _digest(self, namespace: tuple[object, ...]) -> str:
        """The namespace as keys show it: a keyed digest, not the client's address."""
        text = json.dumps(list(namespace), separators=(",", ":"), default=str)
        return hashlib.blake2b(text.encode(), key=self._key, digest_size=16).hexdigest()


class Lookup:
    """One namespace's live members, read once: ask :meth:`same_upload` before decoding,
    then :meth:`same_photo`. Counts once: at a hit, or at ``same_photo``'s miss."""

    def __init__(self, cache: NearDuplicateCache, digest: str, members: list[Member]) -> None:
        self.cache, self.digest, self.members = cache, digest, members  # live, newest first

    def same_upload(self, upload: bytes) -> CachedResult | None:
        """The newest result of the upload of digest ``upload``, or ``None`` (not a miss yet)."""
        for member in self.members:
            if member.upload != _NO_UPLOAD and secrets.compare_digest(member.upload, upload):
                found = self._read(member.entry_id)
                if found is not None:
                    return self.cache._count(found)
        return None

    def same_photo(self, fingerprint: Fingerprint | None) -> CachedResult | None:
        """The result of the closest member that is the same photo (then the newest), or
        ``None``: a miss. Always ``None`` without ``near`` or ``fingerprint``."""
        if not self.cache.enabled:
            return None
        if fingerprint is None or not self.cache.near:
            return self.cache._count(None)
        best = min(((fingerprint.distance(m.fingerprint), age, m.entry_id)  # newest first
                    for age, m in enumerate(self.members)
                    if fingerprint.same_photo(m.fingerprint, self.cache.max_distance)),
                   default=None)
        # None if the entry expired or was evicted since: a miss
        return self.cache._count(self._read(best[2]) if best is not None else None)

    def _read(self, entry_id: bytes) -> CachedResult | None:
        return decode_entry(self.cache.storage.get(
            f"{VERSION}:entry:{self.digest}:{entry_id.hex()}"))
