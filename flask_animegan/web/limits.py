"""Rate limits through Flask-Limiter's public API: the conversion routes share one limit per
client, on whichever Limiter counts (the host's, else ours); the rest is exempt. A request
is charged after it answers, by the pixels the model converted. Redis counts go through
:class:`FallbackCounts`, so no storage error reaches a request."""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, g, request
from flask_limiter import ExemptionScope, Limiter
from limits import parse_many
from limits.storage import MemoryStorage as CountsInMemory
from limits.storage import (
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    storage_from_string,
)
from limits.storage import Storage as CountStorage
from limits.strategies import FixedWindowRateLimiter
from werkzeug.exceptions import HTTPException

from ..config import Settings, StorageURIs, uri_scheme
from ..convert.costs import work_cost
from ..convert.request import parse_size
from ..errors import BadParameter
from ..service import get_service
from ..storage.base import StoreHealth
from . import csrf
from .blueprint import blueprint
from .clients import CONVERSIONS_SCOPE, has_site_key, site_key

log = logging.getLogger("flask_animegan")
#: Short Redis timeouts and no redis-py retries: an outage must not add seconds per request.
REDIS_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
#: The schemes of limits' Redis storages, wrapped as ``animegan+...``.
COUNTED_SCHEMES = ("redis", "rediss", "redis+unix", "redis+sentinel", "redis+cluster")
WRAPPED = "animegan+"
#: Seconds between tries of a rate-limit Redis that is down.
RETRY_AFTER = 2.0
#: maxmemory policies under which Redis may drop a count (counts have TTLs).
EVICTING = frozenset({"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru",
                      "volatile-lfu", "volatile-random", "volatile-ttl"})
_configured: weakref.WeakSet[Limiter] = weakref.WeakSet()
_configuring = threading.Lock()


def host_limiter(extensions: MutableMapping[str, Any],
                 besides: Limiter | None = None) -> Limiter | None:
    """The host app's enabled Limiter other than ``besides``, if any."""
    for existing in extensions.get("limiter", ()):
        if isinstance(existing, Limiter) and existing is not besides and existing.enabled:
            return existing
    return None


def counting_limiter(extensions: MutableMapping[str, Any], own: Limiter | None) -> Limiter:
    """The Limiter that counts this app's conversions now: the host's, else ``own``."""
    host = host_limiter(extensions, besides=own)
    if host is not None:
        return host
    assert own is not None, "init_app makes a Limiter when the app has none"
    return own


class FallbackCounts(CountStorage, MovingWindowSupport, SlidingWindowCounterSupport):
    """Counts in Redis, or here while it is down or full; never raises (flask-limiter's
    fallback covers only the check before the view)."""

    STORAGE_SCHEME = [WRAPPED + scheme for scheme in COUNTED_SCHEMES]  # noqa: RUF012 - limits' registry reads it

    def __init__(self, uri: str | None = None, wrap_exceptions: bool = False,
                 **options: Any) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)
        real = (uri or "")[len(WRAPPED):]
        parts = urlsplit(real)
        self.shared = storage_from_string(real, **options)
        self.local = CountsInMemory()
        where = parts.path if parts.scheme.endswith("unix") else (
            f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}")
        self.health = StoreHealth(
            "the rate-limit storage", f"{parts.scheme}://{where}", retry_after=RETRY_AFTER,
            fallback="counting conversions in this process (each instance counts alone)",
            secret=parts.password)

    @property
    def base_exceptions(self) -> tuple[type[Exception], ...]:
        return ()  # nothing escapes: see _call

    def _call(self, name: str, *args: Any, write: bool) -> Any:
        # while Redis is full its counts are stale: read what this process counted
        if self.health.may_try() and (write or self.health.state != "full"):
            try:
                result = getattr(self.shared, name)(*args)
            except Exception as exc:  # noqa: BLE001 - any storage failure is an outage
                self.health.failed(exc)
            else:
                self.health.succeeded(write)
                return result
        return getattr(self.local, name)(*args)

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return int(self._call("incr", key, expiry, amount, write=True))

    def get(self, key: str) -> int:
        return int(self._call("get", key, write=False))

    def get_expiry(self, key: str) -> float:
        return float(self._call("get_expiry", key, write=False))

    def check(self) -> bool:
        """Whether Redis answers now (one ping, none while a retry wait runs)."""
        if self.health.may_try():
            client = getattr(self.shared, "storage", None)  # limits' redis-py client
            try:
                # limits' check() answers False for any error, naming none
                if client is None and not self.shared.check():
                    raise ConnectionError("no answer to PING")
                if client is not None:
                    client.ping()
            except Exception as exc:  # noqa: BLE001 - any failure is an outage
                self.health.failed(exc)
            else:
                self.health.succeeded(write=False)
        return self.health.state != "down"

    def reset(self) -> int | None:
        self.local.reset()
        return self._call("reset", write=True)  # type: ignore[no-any-return]

    def clear(self, key: str) -> None:
        self.local.clear(key)
        self._call("clear", key, write=True)

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return bool(self._call("acquire_entry", key, limit, expiry, amount, write=True))

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        return self._call("get_moving_window", key, limit, expiry, write=False)  # type: ignore[no-any-return]

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int,
                                     amount: int = 1) -> bool:
        return bool(self._call("acquire_sliding_window_entry", key, limit, expiry, amount,
                               write=True))

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        return self._call("get_sliding_window", key, expiry, write=False)  # type: ignore[no-any-return]

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self._call("clear_sliding_window", key, expiry, write=True)

    def status(self) -> dict[str, Any]:
        """For /healthz: where the counts live and what the last calls saw."""
        return {"backend": "redis", "server": self.health.address, **self.health.status()}

    def maxmemory_policy(self) -> str | None:
        """Redis's ``maxmemory-policy``, or ``None`` when unreachable or refused."""
        client = getattr(self.shared, "storage", None)  # limits' redis-py client
        try:
            reply = client.config_get("maxmemory-policy") if client is not None else {}
        except Exception:  # noqa: BLE001 - refused or unreachable: nothing to say
            return None
        value = reply.get("maxmemory-policy") or reply.get(b"maxmemory-policy")
        return value.decode() if isinstance(value, bytes) else value


def counted_uri(uri: str) -> str:
    """The storage URI our Limiter is given: a Redis one through :class:`FallbackCounts`."""
    return WRAPPED + uri if uri_scheme(uri) in COUNTED_SCHEMES else uri


def own_limiter(app: Flask, settings: Settings, storage: StorageURIs) -> Limiter:
    """A Limiter for an app that has none, counting at ANIMEGAN_STATE_STORAGE_URI; while
    Redis is unreachable or full it counts in this process (:class:`FallbackCounts`)."""
    uri = counted_uri(storage.limiter)
    # passed on to redis-py, which takes float timeouts (flask-limiter types them str | int)
    options: dict[str, Any] = {}
    if uri.startswith(WRAPPED):
        try:
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            pass  # flask-limiter names the missing driver
        else:
            options = {**REDIS_OPTIONS, "retry": Retry(NoBackoff(), 0)}
    # our views add the X-RateLimit-* headers; flask-limiter's would put Retry-After on 200s
    try:
        limiter = Limiter(site_key, app=app, headers_enabled=False, storage_uri=uri,
                          storage_options=options, in_memory_fallback_enabled=True)
    except Exception as exc:  # noqa: BLE001 - flask-limiter's ConfigurationError, a missing driver
        raise ValueError(f"{storage.state_key}: flask-limiter cannot count in "
                         f"{uri_scheme(storage.limiter)}:// ({exc}); set "
                         "ANIMEGAN_STATE_STORAGE_URI to memory:// or redis://host:6379/0") from None
    if settings.rate_limit and isinstance(limiter.storage, FallbackCounts):
        warn_if_evicting(limiter.storage)
    return limiter


def warn_if_evicting(counts: FallbackCounts) -> None:
    """Warn when the counts' Redis may evict keys: a dropped count gives a fresh limit."""
    policy = counts.maxmemory_policy()
    if policy in EVICTING:
        log.warning(
            "flask_animegan: the rate-limit storage at %s has maxmemory-policy %s: when it "
            "fills up, Redis may evict rate-limit counts, and a client whose count is gone "
            "converts again at once. Keep the counts (and the result pages) in a Redis of "
            "their own with maxmemory-policy noeviction (deploy/redis-state.conf) and set "
            "ANIMEGAN_STATE_STORAGE_URI to it; the "
            "cache alone stays in the LRU one (ANIMEGAN_STORAGE_URI)",
            counts.health.address, policy)


_CHARGE = "animegan_charge"


def charge(amount: int) -> None:
    """Set what this request takes from the limit once it answers (0: nothing)."""
    setattr(g, _CHARGE, amount)


def pixel_cost(size: tuple[int, int], faces: int = 0) -> int:
    """What a conversion the model makes at ``size`` costs, ``faces`` converted apart by
    portrait mode (:func:`~flask_animegan.convert.costs.work_cost`)."""
    return work_cost(side=get_service().sizes.default, cap=largest_charge(), size=size, faces=faces)


def charge_pixels(size: tuple[int, int], faces: int = 0) -> None:
    """Charge a conversion the model made at ``size`` (:func:`pixel_cost`)."""
    charge(pixel_cost(size, faces))


class JobAllowance:
    """A job's frames charged as they are decoded, in a worker, through the counting
    Limiter's storage under the key its door recorded (``charge_key``)."""

    def __init__(self, limiter: Callable[[], Limiter], rate_limit: str | None) -> None:
        self.counting = limiter
        self.items = parse_many(rate_limit) if rate_limit else []
        #: the most one piece of work may cost
        self.cap = smallest_limit(rate_limit)

    def take(self, key: list[str], amount: int, *, room: bool = True) -> bool:
        """Take ``amount`` conversions from the client's allowance; False (none taken) when
        they do not fit and ``room`` is asked for (``room=False``: work already done, taken
        anyway). A storage that fails counts as room (as the door's check)."""
        strategy = self.counting().limiter
        try:
            if room and not all(strategy.test(item, *key, cost=amount)
                                for item in self.items):
                return False
            for item in self.items:
                strategy.hit(item, *key, cost=amount)
        except Exception:  # a host Limiter's storage failed
            log.warning("flask_animegan: a job's frames could not be counted", exc_info=True)
        return True

    def refund(self, key: list[str], amount: int) -> None:
        """Give back up to ``amount`` conversions still counted in the current window (a
        fixed window's count; other strategies keep what they took)."""
        limiter = self.counting()
        if not isinstance(limiter.limiter, FixedWindowRateLimiter):
            return
        try:
            for item in self.items:
                counted = item.key_for(*key)
                back = min(amount, limiter.storage.get(counted))
                if back > 0:
                    limiter.storage.incr(counted, item.get_expiry(), amount=-back)
        except Exception:  # a host Limiter's storage failed
            log.warning("flask_animegan: a job's unused conversions could not be given back",
                        exc_info=True)


def smallest_limit(rate_limit: str | None) -> int:
    """The smallest amount among ``rate_limit``'s limits (1: no rate limit): the most one
    piece of work may cost, so that none is refused forever."""
    return min(item.amount for item in parse_many(rate_limit)) if rate_limit else 1


def largest_charge() -> int:
    """The most one request may cost (:func:`smallest_limit` of the app's limit)."""
    return smallest_limit(get_service().settings.rate_limit)


def deducts(response: Response) -> bool:
    """Whether this request counts: it answered below 400 and was charged something (a
    cache hit, a refusal and a failure convert nothing)."""
    return response.status_code < 400 and conversion_cost() > 0


def conversion_cost() -> int:
    """What this request takes from the limit: its charge once it has one; before, the
    most its ``size`` can cost, so that a photo that cannot fit is refused before it runs."""
    charged = g.get(_CHARGE)
    if charged is not None:
        return int(charged)
    service = get_service()
    if request.endpoint == f"{blueprint.name}.create_job" or not service.settings.rate_limit:
        return 1
    raw = request.args.get("size")
    if raw is None and request.mimetype == "multipart/form-data":
        try:
            raw = request.form.get("size")
        except HTTPException:  # too large: the view answers (raised here, an "outage")
            return 1
    side = service.sizes.default
    try:  # the one parser of the view's; a bad size is refused there, and counts 1
        size = parse_size(raw, default=side, largest=service.sizes.photo)
    except BadParameter:
        return 1
    if size <= side:
        return 1
    return max(1, min(largest_charge(), math.ceil((size / side) ** 2)))


def _conversion_limit() -> str:
    return get_service().settings.rate_limit or "1 per second"  # unused when off: _not_counting


def _not_counting(limiter: Limiter) -> bool:
    """Whether ``limiter`` skips this conversion: the limit is off, or another counts it."""
    service = get_service()
    return not service.settings.rate_limit or service.limiter is not limiter


def _form_post_to_refuse() -> bool:
    """Skip a form post its CSRF check refuses: no other site spends a visitor's conversions."""
    if request.endpoint != f"{blueprint.name}.upload":
        return False
    try:
        return not csrf.passes()
    except HTTPException:
        # counted, and the view answers (raised here, it would read as an outage)
        return False


def configure(limiter: Limiter, keyed: bool) -> None:
    """Register our limit and exemptions on ``limiter`` (once per Limiter object);
    ``keyed``: the app sets ANIMEGAN_RATE_LIMIT_KEY, which then keys the limit (else the
    Limiter's own key function does)."""
    with _configuring:
        if limiter in _configured:
            return
        # exempt from the host's default and application-wide limits, not from our own
        limiter.exempt(blueprint, flags=ExemptionScope.DEFAULT | ExemptionScope.APPLICATION)
        # tested before the view at the most it may cost; charged after, by what it converted
        limiter.shared_limit(_conversion_limit, scope=CONVERSIONS_SCOPE, methods=["POST"],
                             key_func=site_key if keyed else None,
                             exempt_when=lambda: _not_counting(limiter),
                             deduct_when=deducts, cost=conversion_cost)(blueprint)
        limiter.request_filter(_form_post_to_refuse)
        _configured.add(limiter)


# before every before_request function, so the host's Limiter is set up before its check
@blueprint.url_value_preprocessor
def _settle_limiter(endpoint: str | None, values: dict[str, Any] | None) -> None:
    limiter = get_service().limiter
    if limiter not in _configured:
        configure(limiter, keyed=has_site_key())
        log.info("flask_animegan: the app's own Limiter counts the conversions")
