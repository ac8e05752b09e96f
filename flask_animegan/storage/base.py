"""The storage the result cache and pages share: bytes under keys with their own TTL. A
backend never raises for an outage (a read finds nothing, a write answers ``False``)."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

log = logging.getLogger("flask_animegan")

def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is Redis refusing a write at ``maxmemory`` (not an outage)."""
    return (any(kind.__name__ == "OutOfMemoryError" for kind in type(error).__mro__)
            or str(error).startswith("OOM ") or "> 'maxmemory'" in str(error))


class StoreHealth:
    """One remote store's state here: ``ok``, ``down`` (one probe per ``retry_after``) or
    ``full`` (only a successful write ends it); each change logged once."""

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
    #: The byte budget this process enforces (``None``: the server's; ``0``: nothing).
    max_bytes: int | None = None

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value under ``key``, or ``None`` (absent, expired, evicted, or unreachable)."""

    @abstractmethod
    def set(self, key: str, value: bytes, ttl: float) -> bool:
        """Store ``value`` under ``key`` for ``ttl`` seconds; ``False`` when it was not stored."""

    def add(self, key: str, value: bytes, ttl: float) -> bool:
        """Store ``value`` only if ``key`` holds nothing; whether it did. Atomic on memory
        and Redis (of several claimants one wins); this default is not."""
        return self.get(key) is None and self.set(key, value, ttl)

    @abstractmethod
    def index(self, name: str, limit: int) -> list[bytes]:
        """Up to ``limit`` members of the list ``name``, newest first (``[]`` if none)."""

    @abstractmethod
    def set_indexed(self, key: str, value: bytes, *, index: str, member: bytes,
                    ttl: float, cap: int) -> bool:
        """Store ``value`` and push ``member`` onto ``index`` (its ``cap`` newest kept),
        atomically; ``False`` when nothing was stored."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """``{"backend": ..., "ok": bool, ...}`` as the last operations saw it; no credential."""

    def ping(self) -> bool:
        """Ask the backend now (unless an outage's retry wait runs); whether it is healthy."""
        return self.healthy

    @property
    def healthy(self) -> bool:
        """Whether the backend answered the last time it was asked (and took the last write)."""
        return True

    @property
    def reachable(self) -> bool:
        """Whether the last call reached the backend: ``False`` only while it is down, when
        a read's "nothing" means "cannot say" (a full Redis still answers reads)."""
        return True

    def maxmemory_policy(self) -> str | None:
        """The server's eviction policy, where a server has one and says it (else ``None``)."""
        return None
