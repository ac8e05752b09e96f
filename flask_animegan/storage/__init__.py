"""Where the result cache and the result pages live, chosen by one URI: ``memory://``
in this process, or Redis shared by every instance (redis-py imported only then)."""

from __future__ import annotations

from ..config import REDIS_SCHEMES, STORAGE_SCHEMES, uri_scheme
from .base import Storage
from .memory import MemoryStorage

__all__ = ["MemoryStorage", "Storage", "open_storage"]


def open_storage(uri: str, *, max_bytes: int, prefix: str) -> Storage:
    """A :class:`MemoryStorage` of ``max_bytes``, or a Redis one whose keys start with
    ``prefix``; ValueError for another scheme, ImportError when redis-py is missing."""
    scheme = uri_scheme(uri)
    if scheme == "memory":
        return MemoryStorage(max_bytes)
    if scheme in REDIS_SCHEMES:
        try:
            from .redis import RedisStorage
        except ImportError as exc:
            if exc.name not in ("redis", None):
                raise
            raise ImportError(f"a {scheme}:// storage URI needs redis-py: "
                              "pip install 'flask-animegan[redis]'") from None
        return RedisStorage(uri, prefix=prefix)
    # only the scheme: the rest of a URI may hold a password
    raise ValueError(f"unsupported storage URI scheme {scheme!r}: use one of "
                     + ", ".join(f"{name}://" for name in STORAGE_SCHEMES))
