"""Storage in this process: one cachetools TLRU cache bounded in bytes, per-item expiry,
least recently used first out. Each process has its own: use Redis to share."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TLRUCache

from .base import Storage

#: Rough bytes of bookkeeping per item (key, dict slot, links), counted in the budget.
ITEM_OVERHEAD = 256


@dataclass(frozen=True)
class _Item:
    payload: bytes | tuple[bytes, ...]  # a value, or an index's members newest first
    ttl: float

    @property
    def nbytes(self) -> int:
        if isinstance(self.payload, bytes):
            return len(self.payload) + ITEM_OVERHEAD
        return sum(len(member) for member in self.payload) + ITEM_OVERHEAD


class MemoryStorage(Storage):
    """Values and index lists in a byte-bounded, per-item-TTL LRU cache, safe across threads."""

    backend = "memory"
    max_bytes: int

    def __init__(self, max_bytes: int, *, timer: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max(int(max_bytes), 0)
        self._items: TLRUCache[tuple[str, str], _Item] = TLRUCache(
            maxsize=max(self.max_bytes, 1), ttu=lambda _key, item, now: now + item.ttl, timer=timer,
            getsizeof=lambda item: item.nbytes)
        # gunicorn's threads share one storage; cachetools caches are not thread-safe
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._items.get(("value", key))  # a read refreshes its LRU position
        return item.payload if item is not None and isinstance(item.payload, bytes) else None

    def set(self, key: str, value: bytes, ttl: float) -> bool:
        with self._lock:
            return self._store(("value", key), _Item(bytes(value), ttl))

    def add(self, key: str, value: bytes, ttl: float) -> bool:
        with self._lock:
            if self._items.get(("value", key)) is not None:
                return False
            return self._store(("value", key), _Item(bytes(value), ttl))

    def index(self, name: str, limit: int) -> list[bytes]:
        with self._lock:
            item = self._items.get(("index", name))
        return [] if item is None or isinstance(item.payload, bytes) else list(item.payload[:limit])

    def set_indexed(self, key: str, value: bytes, *, index: str, member: bytes,
                    ttl: float, cap: int) -> bool:
        with self._lock:
            if not self._store(("value", key), _Item(bytes(value), ttl)):
                return False
            previous = self._items.get(("index", index))
            older = previous.payload[:max(cap - 1, 0)] if previous is not None else ()
            return self._store(("index", index), _Item((bytes(member), *older), ttl))

    def status(self) -> dict[str, Any]:
        with self._lock:
            self._items.expire()
            values = sum(1 for kind, _ in self._items if kind == "value")
            return {"backend": self.backend, "ok": True, "entries": values,
                    "indexes": len(self._items) - values, "bytes": self._items.currsize,
                    "max_bytes": self.max_bytes}

    def _store(self, key: tuple[str, str], item: _Item) -> bool:
        """Put ``item`` (evicting older ones); ``False`` if it alone exceeds the budget."""
        if item.ttl <= 0 or item.nbytes > self.max_bytes:
            self._items.pop(key, None)  # a stale value must not outlive a refused update
            return False
        self._items[key] = item
        return True
