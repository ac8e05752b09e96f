"""The storage interface the result cache and the result pages share.

Values are bytes, every key has its own time to live, and each operation is one
round trip to the backend (a Redis server, or nothing for the in-process memory).
A backend never raises for an outage: a read answers "nothing" and a write answers
``False``, so a conversion goes on without the store. :class:`StoreHealth` is how a
remote store (the Redis of the cache and pages, the rate limit's) tracks its outages.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

log = logging.getLogger("flask_animegan")

#: What a store's health reads: it answers; it cannot be reached or times out (reads and
#: writes skipped); it refuses writes because its memory is full (Redis ``OOM`` under
#: ``noeviction``: reads still answer).
STATES = ("ok", "down", "full")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is Redis refusing a write at ``maxmemory`` (the ``OOM`` reply:
    redis-py's ``OutOfMemoryError``), as opposed to a store that cannot be reached."""
    return (any(kind.__name__ == "OutOfMemoryError" for kind in type(error).__mro__)
            or str(error).startswith("OOM ") or "> 'maxmemory'" in str(error))


class StoreHealth:
    """One remote store's state as this process sees it: ``ok``, ``down`` or ``full``.

    Each change is logged once (the start of an episode as a warning, its end too), never
    per request. While ``down``, :meth:`may_try` lets one call through per
    ``retry_after`` seconds (the probe) and the others go without the store at once; a
    success of any call ends it. While ``full``, every call may try (Redis answers reads
    and refuses a write at once), and only a write that succeeds ends it.
    """

    def __init__(self, what: str, address: str, *, retry_after: float, fallback: str,
                 secret: str | None = None) -> None:
        self.what = what  # "Redis" or "the rate-limit storage"
        self.address = address
        self.retry_after = retry_after
        self.fallback = fallback  # what happens meanwhile, for the log line
        self.state = "ok"
        self.error: str | None = None  # the last failure's class (or "OOM")
        self._secret = secret
        self._next_try = 0.0
        self._lock = threading.Lock()

    def may_try(self) -> bool:
        """Whether this call may use the store now (``False``: go without it)."""
        if self.state != "down":
            return True  # a full Redis still answers reads, and refuses a write at once
        with self._lock:
            now = time.monotonic()
            if self.state != "down":
                return True
            if now < self._next_try:
                return False
            self._next_try = now + self.retry_after
            return True

    def failed(self, error: BaseException) -> None:
        """A call failed: the store is ``full`` (an OOM reply) or else ``down``."""
        state = "full" if is_out_of_memory(error) else "down"
        with self._lock:
            self._next_try = time.monotonic() + self.retry_after
            if self.state == state:
                return  # the same episode
            self.state, self.error = state, "OOM" if state == "full" else type(error).__name__
        message = str(error)
        if self._secret:
            message = message.replace(self._secret, "***")
        if state == "full":
            log.warning("flask_animegan: %s at %s is full and refuses writes (%s); %s until "
                        "a write succeeds. Raise its maxmemory (the sizing is in "
                        "docs/deployment.md) or lower the TTLs", self.what, self.address,
                        message[:200], self.fallback)
        else:
            log.warning("flask_animegan: %s at %s is unavailable (%s: %s); %s, trying again "
                        "every %g s", self.what, self.address, self.error, message[:200],
                        self.fallback, self.retry_after)

    def succeeded(self, write: bool) -> None:
        """A call succeeded: that ends ``down``; only a write ends ``full``."""
        if self.state == "ok" or (self.state == "full" and not write):
            return
        with self._lock:
            if self.state == "ok" or (self.state == "full" and not write):
                return
            was, self.state, self.error = self.state, "ok", None
        log.warning("flask_animegan: %s at %s %s", self.what, self.address,
                    "takes writes again" if was == "full" else "is available again")

    def status(self) -> dict[str, Any]:
        """``ok``, ``state`` and ``error`` for health checks."""
        return {"ok": self.state == "ok", "state": self.state, "error": self.error}


class Storage(ABC):
    """Bytes under string keys, each with a TTL, plus capped lists of recent members."""

    #: ``"memory"`` or ``"redis"``
    backend: str = ""
    #: The byte budget this process enforces; ``None`` when the server enforces it
    #: (Redis ``maxmemory``). ``0`` stores nothing.
    max_bytes: int | None = None

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None`` (absent, expired, evicted, or unreachable)."""

    @abstractmethod
    def set(self, key: str, value: bytes, ttl: float) -> bool:
        """Store ``value`` under ``key`` for ``ttl`` seconds; ``False`` when it was not stored."""

    def add(self, key: str, value: bytes, ttl: float) -> bool:
        """Store ``value`` under ``key`` for ``ttl`` seconds only if ``key`` holds nothing;
        whether it did. Atomic on memory and Redis (one ``SET NX``), so of several
        processes claiming one key exactly one wins; this default is not atomic."""
        return self.get(key) is None and self.set(key, value, ttl)

    @abstractmethod
    def index(self, name: str, limit: int) -> list[bytes]:
        """Up to ``limit`` members of the list ``name``, newest first (``[]`` if none)."""

    @abstractmethod
    def set_indexed(self, key: str, value: bytes, *, index: str, member: bytes,
                    ttl: float, cap: int) -> bool:
        """Store ``value`` under ``key`` and push ``member`` onto the list ``index``, atomically.

        The list keeps its ``cap`` newest members and lives ``ttl`` seconds after
        this push. Returns ``False`` when nothing was stored.
        """

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """``{"backend": ..., "ok": bool, ...}`` for health checks; never a credential.

        Reports what the last operations saw: no round trip while the backend is
        healthy (while it is down, a probe at most as often as a retry would).
        """

    def ping(self) -> bool:
        """Ask the backend now (one round trip; none while an outage's retry wait runs).

        Returns whether it is healthy; for a health check that must not wait for traffic.
        """
        return self.healthy

    @property
    def healthy(self) -> bool:
        """Whether the backend answered the last time it was asked (and took the last write)."""
        return True

    def maxmemory_policy(self) -> str | None:
        """The server's eviction policy, where a server has one and says it (else ``None``)."""
        return None
