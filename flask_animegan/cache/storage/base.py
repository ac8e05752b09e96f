"""The storage interface the result cache and the result pages share.

Values are bytes, every key has its own time to live, and each operation is one
round trip to the backend (a Redis server, or nothing for the in-process memory).
A backend never raises for an outage: a read answers "nothing" and a write answers
``False``, so a conversion goes on without the store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


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
        """Whether the backend answered the last time it was asked."""
        return True
