"""Rate limits, through Flask-Limiter's public API only.

Conversions (the blueprint's POST routes, ``/upload`` and ``/convert``) share one
limit per client; nothing else of ours is limited, by our limit or by the host's
default, application or meta limits: ``/healthz`` must answer load balancers
whatever the host configured. The limits live in the Limiter (a blueprint limit with
a callable value, and an exemption), so the host app's view functions are never
touched, and two apps with one Limiter each keep their own.

Which Limiter counts is decided per request, not switched once: the host app's, if it
has one (enabled) besides ours, else the one the extension made at ``init_app``. A
host Limiter made after ``AnimeGAN(app)`` gets our limit and exemptions at the first
request under the prefix (before any before_request function, its check included),
and from then on ours exempts the conversions, so exactly one Limiter counts them.
``ANIMEGAN_RATE_LIMIT`` was parsed by flask-limiter's parser at start (config.py): a
limit that reaches here always applies.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import MutableMapping
from typing import Any

from flask import Flask, request
from flask_limiter import ExemptionScope, Limiter
from werkzeug.exceptions import HTTPException

from ..config import REDIS_SCHEMES, Settings
from ..service import get_service
from . import csrf
from .blueprint import blueprint
from .clients import CONVERSIONS_SCOPE, client_address

log = logging.getLogger("flask_animegan")
#: Redis timeouts for the rate-limit storage: an outage must not add seconds per request.
REDIS_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
_configured: weakref.WeakSet[Limiter] = weakref.WeakSet()
_configuring = threading.Lock()


def host_limiter(extensions: MutableMapping[str, Any],
                 besides: Limiter | None = None) -> Limiter | None:
    """The host app's enabled flask-limiter Limiter, if it has one (other than ``besides``);
    ``extensions`` is the app's ``app.extensions``."""
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


def own_limiter(app: Flask, settings: Settings) -> Limiter:
    """A Limiter for an app that has none, storing counts at ANIMEGAN_RATELIMIT_STORAGE_URI
    (default: ANIMEGAN_STORAGE_URI). While Redis is unreachable it counts in this
    process's memory (flask-limiter's in-memory fallback) and goes back once Redis
    answers again."""
    uri = settings.ratelimit_storage
    # passed on to redis-py, which takes float timeouts (flask-limiter types them str | int)
    uses_redis = uri.split("://")[0].split("+")[0] in REDIS_SCHEMES
    options: dict[str, Any] = dict(REDIS_OPTIONS) if uses_redis else {}
    # Our views add the X-RateLimit-* headers (flask-limiter's would put Retry-After on
    # every response, 200s included); 429s carry Retry-After from our error handler.
    try:
        return Limiter(client_address, app=app, headers_enabled=False, storage_uri=uri,
                       storage_options=options, in_memory_fallback_enabled=True)
    except Exception as exc:  # noqa: BLE001 - flask-limiter's ConfigurationError, a missing driver
        key = ("ANIMEGAN_RATELIMIT_STORAGE_URI" if settings.ratelimit_storage_uri
               else "ANIMEGAN_STORAGE_URI")
        raise ValueError(f"{key}: flask-limiter cannot count in {uri.split('://')[0]}:// "
                         f"({exc}); set ANIMEGAN_RATELIMIT_STORAGE_URI to memory:// or "
                         "redis://host:6379/0 (redis+unix:///path for a socket)") from None


def _conversion_limit() -> str:
    return get_service().rate_limit or "1 per second"  # unused when off: _not_counting


def _not_counting(limiter: Limiter) -> bool:
    """Whether ``limiter`` skips this conversion: the limit is off, or another Limiter
    (the host's) counts it."""
    service = get_service()
    return not service.rate_limit or service.limiter is not limiter


def _form_post_to_refuse() -> bool:
    """A form upload that its CSRF check will refuse is not counted (the view or Flask-WTF
    answers 400): a page on another site must not spend a visitor's conversions."""
    if request.endpoint != f"{blueprint.name}.upload":
        return False
    try:
        return not csrf.passes()
    except HTTPException:
        # the form cannot be read (too large, too many parts): counted, and the view
        # answers. Raised from here, flask-limiter would take it for a storage outage.
        return False


def configure(limiter: Limiter) -> None:
    """Register our limit and exemptions on ``limiter`` (once per Limiter object)."""
    with _configuring:
        if limiter in _configured:
            return
        # exempt from the host's default and application-wide limits, not from our own
        limiter.exempt(blueprint, flags=ExemptionScope.DEFAULT | ExemptionScope.APPLICATION)
        limiter.shared_limit(_conversion_limit, scope=CONVERSIONS_SCOPE, methods=["POST"],
                             exempt_when=lambda: _not_counting(limiter))(blueprint)
        limiter.request_filter(_form_post_to_refuse)
        _configured.add(limiter)


# A URL value preprocessor: Flask runs these before every before_request function, so
# the host's Limiter has our limit and exemptions before its own check runs.
@blueprint.url_value_preprocessor
def _settle_limiter(endpoint: str | None, values: dict[str, Any] | None) -> None:
    limiter = get_service().limiter
    if limiter not in _configured:
        configure(limiter)
        log.info("flask_animegan: the app's own Limiter counts the conversions")
