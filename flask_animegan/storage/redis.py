"""Storage in a Redis server shared by every instance: every key has a TTL and every index a
cap; the byte budget is the server's ``maxmemory`` (deploy/). While Redis is down, calls answer
"nothing" at once and one probe runs every ``retry_after``; while it is full, reads go on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..config import uri_scheme
from .base import Storage, StoreHealth

T = TypeVar("T")
#: Seconds a call may wait for Redis, and between two probes while it is down.
TIMEOUT, RETRY_AFTER = 0.5, 2.0


class _Server:
    """One Redis server's client pool and health, shared by every store on its URI."""

    def __init__(self, uri: str, *, timeout: float, retry_after: float) -> None:
        # no retries inside redis-py: an outage must cost one timeout, then none for a while
        self.client = redis.Redis.from_url(uri, socket_timeout=timeout,
                                           socket_connect_timeout=timeout,
                                           retry=Retry(NoBackoff(), 0),
                                           health_check_interval=0)
        self.address = _address(uri, self.client)
        password = self.client.connection_pool.connection_kwargs.get("password")
        self.health = StoreHealth(
            "Redis", self.address, retry_after=retry_after,
            fallback="going on without the shared cache (result pages kept in this process)",
            secret=str(password) if password else None)

    def run(self, operation: Callable[[redis.Redis], T], default: T, *,
            write: bool = False) -> T:
        """``operation(client)``, or ``default`` when Redis is down or the call fails."""
        if not self.health.may_try():
            return default
        try:
            result = operation(self.client)
        except (redis.RedisError, OSError) as exc:
            self.health.failed(exc)
            return default
        self.health.succeeded(write)
        return result

    def maxmemory_policy(self) -> str | None:
        """The server's ``maxmemory-policy``; ``None`` when unreachable or refused."""
        try:
            reply: dict[Any, Any] = dict(self.client.config_get("maxmemory-policy"))
        except (redis.RedisError, OSError):
            return None
        value = reply.get("maxmemory-policy") or reply.get(b"maxmemory-policy")
        return value.decode() if isinstance(value, bytes) else value


_servers: dict[tuple[str, float, float], _Server] = {}
_servers_lock = threading.Lock()


def _server(uri: str, timeout: float, retry_after: float) -> _Server:
    """The process's shared :class:`_Server` for ``uri`` (made on first use)."""
    with _servers_lock:
        key = (uri, timeout, retry_after)
        if key not in _servers:
            _servers[key] = _Server(uri, timeout=timeout, retry_after=retry_after)
        return _servers[key]


def client(uri: str) -> redis.Redis:
    """The process's one client for the Redis server at ``uri``, with the storage's short
    timeouts: the cache, the pages, the jobs' records and the job queue share it."""
    return _server(uri, TIMEOUT, RETRY_AFTER).client


def _address(uri: str, client: redis.Redis) -> str:
    """Where the server is, for logs and health checks: the URI without credentials."""
    options = client.connection_pool.connection_kwargs
    db = options.get("db", 0)
    if "path" in options:
        return f"unix://{options['path']}?db={db}"
    host, port = options.get("host", "localhost"), options.get("port", 6379)
    return f"{uri_scheme(uri)}://{host}:{port}/{db}"


def _milliseconds(ttl: float) -> int:
    return max(int(ttl * 1000), 1)


class RedisStorage(Storage):
    """Values and capped index lists in Redis under ``prefix``; quiet and quick when it is down."""

    backend = "redis"
    max_bytes = None  # Redis maxmemory

    def __init__(self, uri: str, *, prefix: str, timeout: float = TIMEOUT,
                 retry_after: float = RETRY_AFTER) -> None:
        self.prefix = prefix
        self._server = _server(uri, timeout, retry_after)

    def get(self, key: str) -> bytes | None:
        # the client is made without decode_responses, so replies are bytes
        return self._server.run(
            lambda client: cast("bytes | None", client.get(self.prefix + key)), None)

    def set(self, key: str, value: bytes, ttl: float) -> bool:
        if ttl <= 0:
            return False
        return self._server.run(
            lambda client: bool(client.set(self.prefix + key, value, px=_milliseconds(ttl))),
            False, write=True)

    def add(self, key: str, value: bytes, ttl: float) -> bool:
        if ttl <= 0:
            return False
        return self._server.run(
            lambda client: bool(client.set(self.prefix + key, value, px=_milliseconds(ttl),
                                           nx=True)), False, write=True)

    def index(self, name: str, limit: int) -> list[bytes]:
        if limit <= 0:
            return []
        return self._server.run(
            lambda client: cast("list[bytes]", client.lrange(self.prefix + name, 0, limit - 1)),
            [])

    def set_indexed(self, key: str, value: bytes, *, index: str, member: bytes,
                    ttl: float, cap: int) -> bool:
        if ttl <= 0 or cap <= 0:
            return False

        def write(client: redis.Redis) -> bool:
            pipe = client.pipeline(transaction=True)
            pipe.set(self.prefix + key, value, px=_milliseconds(ttl))
            pipe.lpush(self.prefix + index, member)
            pipe.ltrim(self.prefix + index, 0, cap - 1)
            pipe.pexpire(self.prefix + index, _milliseconds(ttl))
            return bool(pipe.execute()[0])

        return self._server.run(write, False, write=True)

    def ping(self) -> bool:
        return self._server.run(lambda client: bool(client.ping()), False)

    def status(self) -> dict[str, Any]:
        if self._server.health.state == "down":
            self.ping()  # so that a recovery shows even when no request uses the storage
        return {"backend": self.backend, "server": self._server.address,
                **self._server.health.status()}

    def maxmemory_policy(self) -> str | None:
        return self._server.maxmemory_policy()

    @property
    def healthy(self) -> bool:
        return self._server.health.state == "ok"

    @property
    def reachable(self) -> bool:
        return self._server.health.state != "down"
