"""The near-duplicate result cache: a result is reused only for the same photo.

"The same photo" is one rule, :meth:`Fingerprint.same_photo` (stated in
docs/http-api.md), checked against what each entry keeps of its input: a
:class:`~flask_animegan.cache.fingerprint.Fingerprint` of a few KiB and a keyed digest of
the upload's bytes, never the upload or its pixels. The digest is a shortcut the rule
already allows: the same bytes decode to the same statistics, whose fingerprint is
always the same photo as itself, so an upload sent again is answered from the index
before it is decoded at all (:meth:`Lookup.same_upload`), and only an upload the index
has not seen pays its decode and fingerprint (:meth:`Lookup.same_photo`).

Entries live in a :mod:`flask_animegan.cache.storage` backend: an in-process
``MemoryStorage`` (a cachetools TLRU cache bounded by ANIMEGAN_CACHE_MAX_BYTES) or Redis,
shared by every instance and bounded by the server's ``maxmemory`` with
``maxmemory-policy allkeys-lru``. No client can make Redis grow without bound: each
namespace (client, style, size, format) has one index capped at ``index_cap`` members,
so at most ``index_cap`` live entries, and every key has a TTL.

Layout (keys under the storage's prefix, e.g. ``animegan:cache:``):

- ``index:<namespace digest>``: a list, newest first, of at most ``index_cap`` members;
  a member is a 66-byte header (magic, creation time, the fitted width and
  height, the upload's width and height and JPEG tables' digest, phash length, entry id, upload
  digest), the phash (32 bytes at hash_size 16) and the two cell grids (11,264 bytes):
  11,362 bytes.
- ``entry:<namespace digest>:<id>``: a 16-byte header (magic, width, height, length)
  and the result's bytes.

Redis round trips: a lookup reads the index once (at most ``index_cap`` members: 122 KiB
at the default 11), for the upload's digest and then, if need be, for the rule on each
member; a miss ends there (1 round trip), a hit reads the chosen entry (2). Storing a result is one more (the entry and its index member
in one MULTI/EXEC). Bytes per entry, measured with ``MEMORY USAGE`` on Redis 7
(tests/test_storage.py, bench/cache_rule.py): its result rounded up to jemalloc's size
class (up to +25 %, about +10 % on average) + about 130 bytes of key and header, plus
about 12,300 bytes for its member in the index.

The namespace holds the client's address (ANIMEGAN_CACHE_SCOPE "client"), so keys carry
only a keyed BLAKE2b digest of it. Stored bytes use a small explicit binary format,
never pickle: data in a shared Redis must not be able to run code here, and a member or
value that does not parse is skipped like a miss.
"""

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

from .samples import Samples
from .fingerprint import GRID_BYTES, Fingerprint
from .storage import MemoryStorage, Storage

# Little-endian throughout, so every instance reads what any other wrote.
# magic, created (Unix time), width, height, the upload's width, height and JPEG tables,
# phash bytes, entry id, upload digest
_MEMBER = struct.Struct("<4sdIIIIIH16s16s")
_MEMBER_MAGIC = b"AGF9"  # AGF8 (grids of the fitted input), AGF7 (box-filtered): skipped
_ENTRY = struct.Struct("<4sIIiI")  # magic, width, height, faces, length of the result
_ENTRY_MAGIC = b"AGE4"
#: Members a namespace's index keeps: a lookup reads at most 11 x 11,362 bytes (122 KiB).
INDEX_CAP = 11


class IndexMember(NamedTuple):
    """One cache entry as its namespace's index lists it."""

    created: float  # Unix time, comparable between instances
    entry_id: bytes  # 16 random bytes naming the entry's key
    fingerprint: Fingerprint
    upload: bytes = bytes(16)  # the upload's keyed digest (NearDuplicateCache.upload_digest)


def phash_bytes(hash_size: int) -> int:
    """Bytes of a phash of ``hash_size`` (its hash_size² bits, packed)."""
    return (hash_size * hash_size + 7) // 8


def encode_member(member: IndexMember, hash_size: int) -> bytes:
    """The index member's bytes: header, phash, cell grid."""
    fp = member.fingerprint
    size = phash_bytes(hash_size)
    return b"".join((_MEMBER.pack(_MEMBER_MAGIC, member.created, *fp.size, *fp.source,
                                  fp.jpeg_tables, size, member.entry_id, member.upload),
                     fp.phash.to_bytes(size, "big"), fp.to_bytes()))


def decode_member(blob: bytes, hash_size: int) -> IndexMember | None:
    """The member in ``blob``, or ``None`` if it is not one of ``hash_size`` (never raises)."""
    size = phash_bytes(hash_size)
    if not isinstance(blob, bytes) or len(blob) != _MEMBER.size + size + GRID_BYTES:
        return None
    (magic, created, width, height, source_width, source_height, tables, stored_size,
     entry_id, upload) = _MEMBER.unpack_from(blob)
    if (magic != _MEMBER_MAGIC or stored_size != size or not math.isfinite(created)
            or not (width > 0 and height > 0)):
        return None
    phash = int.from_bytes(blob[_MEMBER.size:_MEMBER.size + size], "big")
    luma, cells = Fingerprint.grids_from(blob, _MEMBER.size + size)
    fingerprint = Fingerprint(phash, (width, height), luma, cells,
                              (source_width, source_height), tables)
    return IndexMember(created, entry_id, fingerprint, upload)


@dataclass(frozen=True)
class CachedResult:
    data: bytes
    size: tuple[int, int]
    faces: int = -1  # faces portrait mode converted in it; -1: portrait mode did not run


def encode_entry(data: bytes, size: tuple[int, int], faces: int = -1) -> bytes:
    """An entry: its header, then the result."""
    return _ENTRY.pack(_ENTRY_MAGIC, *size, faces, len(data)) + data


def decode_entry(blob: bytes | None) -> CachedResult | None:
    """The cached result in ``blob``, or ``None`` if there is none or it does not parse."""
    if not isinstance(blob, bytes) or len(blob) < _ENTRY.size:
        return None
    magic, width, height, faces, length = _ENTRY.unpack_from(blob)
    if magic != _ENTRY_MAGIC or _ENTRY.size + length != len(blob) or faces < -1:
        return None
    return CachedResult(blob[_ENTRY.size:], (width, height), faces)


class NearDuplicateCache:
    """Results keyed by (namespace, perceptual hash), reused only for the same photo.

    A lookup hits when a live entry of the namespace passes
    :meth:`Fingerprint.same_photo` with ``max_distance``; of those, the closest phash
    (then the newest) is read. Only the ``index_cap`` newest entries of a namespace are
    candidates. Without ``storage``, entries live in a private ``MemoryStorage`` of
    ``max_bytes``. ``key`` (e.g. the app's secret key) keys the namespace digests.
    """

    def __init__(self, storage: Storage | None = None, *, ttl: float,
                 max_bytes: int | None = None, hash_size: int = 16, max_distance: int = 6,
                 index_cap: int = INDEX_CAP, key: bytes = b"") -> None:
        if storage is None:
            if max_bytes is None:
                raise TypeError("NearDuplicateCache needs a storage or max_bytes")
            storage = MemoryStorage(max_bytes)
        self.storage = storage
        self.ttl = ttl
        self.enabled = ttl > 0 and index_cap > 0 and storage.max_bytes != 0
        self.hash_size = hash_size
        self.max_distance = max_distance
        self.index_cap = index_cap
        # BLAKE2b keys are at most 64 bytes; a digest of any secret fits
        self._key = hashlib.sha256(key).digest() if key else b""
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def fingerprint(self, samples: Samples, *, size: tuple[int, int],
                    source: tuple[int, int] | None = None, jpeg_tables: int = 0) -> Fingerprint:
        """The fingerprint of an upload from its statistics, fitted to ``size`` (a
        SampledUpload's ``samples``, ``source_size`` and ``jpeg_tables``; without the
        last, never the same-JPEG share): :meth:`Fingerprint.of`."""
        return Fingerprint.of(samples, self.hash_size, size=size, source=source,
                              jpeg_tables=jpeg_tables)

    def upload_digest(self, data: bytes) -> bytes:
        """The upload's keyed digest (16 bytes), as members keep it: without the key (the
        app's secret) it cannot be checked against a known photo."""
        return hashlib.blake2b(data, key=self._key, digest_size=16).digest()

    def lookup(self, namespace: tuple[object, ...]) -> Lookup:
        """The namespace's live index, read once (one storage round trip), to ask about
        an upload's digest and then, if need be, its fingerprint."""
        digest = self._digest(namespace)
        members: list[IndexMember] = []
        if self.enabled:
            oldest = time.time() - self.ttl  # the index outlives its older entries
            for blob in self.storage.index(f"index:{digest}", self.index_cap):
                member = decode_member(blob, self.hash_size)
                if member is not None and member.created >= oldest:
                    members.append(member)  # newest first
        return Lookup(self, digest, members)

    def get(self, namespace: tuple[object, ...], fingerprint: Fingerprint) -> CachedResult | None:
        """The result of the same photo in ``namespace``, or ``None`` (a miss).

        One storage round trip for a miss (the namespace's index), two for a hit (and
        the chosen entry).
        """
        return self.lookup(namespace).same_photo(fingerprint)

    def _count(self, found: CachedResult | None) -> CachedResult | None:
        with self._lock:
            if found is None:
                self.misses += 1
            else:
                self.hits += 1
        return found

    def put(self, namespace: tuple[object, ...], fingerprint: Fingerprint, data: bytes,
            size: tuple[int, int], faces: int = -1, upload: bytes = bytes(16)) -> None:
        """Keep ``data`` (``size`` pixels, ``faces`` converted in portrait mode) for the
        same photo as ``fingerprint``, sent as the upload of digest ``upload``
        (:meth:`upload_digest`): one round trip."""
        if not self.enabled:
            return
        digest = self._digest(namespace)
        member = IndexMember(time.time(), secrets.token_bytes(16), fingerprint, upload)
        self.storage.set_indexed(f"entry:{digest}:{member.entry_id.hex()}",
                                 encode_entry(data, size, faces), index=f"index:{digest}",
                                 member=encode_member(member, self.hash_size),
                                 ttl=self.ttl, cap=self.index_cap)

    def stats(self) -> dict[str, Any]:
        """Hits and misses of this process, and the storage's status (no round trip)."""
        with self._lock:
            counts = {"enabled": self.enabled, "hits": self.hits, "misses": self.misses}
        return {**counts, **self.storage.status()}

    def _digest(self, namespace: tuple[object, ...]) -> str:
        """The namespace as it appears in keys: a keyed digest, not the client's address."""
        text = json.dumps(list(namespace), separators=(",", ":"), default=str)
        return hashlib.blake2b(text.encode(), key=self._key, digest_size=16).hexdigest()



class Lookup:
    """One namespace's live index members, read once, asked about one upload: first
    :meth:`same_upload` (before decoding), then, if that missed, :meth:`same_photo`. A
    lookup counts once in the cache's hits or misses: at its hit, or at ``same_photo``."""

    def __init__(self, cache: NearDuplicateCache, digest: str,
                 members: list[IndexMember]) -> None:
        self.cache = cache
        self.digest = digest
        self.members = members  # live, newest first

    def same_upload(self, upload: bytes) -> CachedResult | None:
        """The newest result of an upload with the digest ``upload``, or ``None`` (not
        counted as a miss: :meth:`same_photo` decides that)."""
        if upload == bytes(16):  # a member stored without an upload's digest
            return None
        for member in self.members:
            if secrets.compare_digest(member.upload, upload):
                found = self._read(member.entry_id)
                if found is not None:
                    return self.cache._count(found)
        return None

    def same_photo(self, fingerprint: Fingerprint) -> CachedResult | None:
        """The result of the closest live member that is the same photo (then the
        newest), or ``None``: a miss."""
        if not self.cache.enabled:
            return None
        best: tuple[int, bytes] | None = None
        for member in self.members:  # newest first, so equal distances keep the newest
            if not fingerprint.same_photo(member.fingerprint, self.cache.max_distance):
                continue
            distance = fingerprint.distance(member.fingerprint)
            if best is None or distance < best[0]:
                best = (distance, member.entry_id)
        # None if the entry expired or was evicted since: a miss
        return self.cache._count(self._read(best[1]) if best is not None else None)

    def _read(self, entry_id: bytes) -> CachedResult | None:
        return decode_entry(self.cache.storage.get(f"entry:{self.digest}:{entry_id.hex()}"))
