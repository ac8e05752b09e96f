"""Rate limits, through Flask-Limiter's own API.

Conversions (the blueprint's POST routes, ``/upload`` and ``/convert``) share one
limit per client; nothing else of ours is limited, by our limit or by the host's
default, application or meta limits: ``/healthz`` must answer load balancers
whatever the host configured. The limits live in the Limiter (a blueprint limit with
a callable value, and an exemption), so the host app's view functions are never
touched, and two apps with one Limiter each keep their own.

If the host app has a Limiter, it is used (its storage, key function and headers).
If it makes one only after ``AnimeGAN(app)``, the first request hands our limit over
to it and switches ours off, so there is never a second limiter counting our routes.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from flask import Flask, current_app, request
from flask_limiter import ExemptionScope, Limiter
from werkzeug.exceptions import HTTPException

from ..config import Settings
from . import csrf
from .clients import client_address
from .views import blueprint

log = logging.getLogger("flask_animegan")
#: Upload and convert count against one budget per client.
CONVERSIONS_SCOPE = "animegan-conversions"
#: Redis timeouts for the rate-limit storage: an outage must not add seconds per request.
REDIS_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
_configured: weakref.WeakSet[Limiter] = weakref.WeakSet()


def host_limiter(app: Flask, besides: Limiter | None = None) -> Limiter | None:
    """The host app's flask-limiter Limiter, if it has one (other than ``besides``)."""
    for existing in app.extensions.get("limiter", ()):
        if isinstance(existing, Limiter) and existing is not besides:
            return existing
    return None


def own_limiter(app: Flask, settings: Settings) -> Limiter:
    """A Limiter for an app that has none, storing counts at ANIMEGAN_RATELIMIT_STORAGE_URI
    (default: ANIMEGAN_STORAGE_URI). While Redis is unreachable it counts in this
    process's memory (flask-limiter's in-memory fallback) and goes back once Redis
    answers again."""
    uri = settings.ratelimit_storage
    # passed on to redis-py, which takes float timeouts (flask-limiter types them str | int)
    uses_redis = uri.split("://")[0] in ("redis", "rediss", "unix")
    options: dict[str, Any] = dict(REDIS_OPTIONS) if uses_redis else {}
    # Our views add the X-RateLimit-* headers (flask-limiter's would put Retry-After on
    # every response, 200s included); 429s carry Retry-After from our error handler.
    return Limiter(client_address, app=app, headers_enabled=False, storage_uri=uri,
                   storage_options=options, in_memory_fallback_enabled=True)


def _conversion_limit() -> str:
    return str(current_app.extensions["animegan"].rate_limit or "1 per second")


def _limit_is_off() -> bool:
    return not current_app.extensions["animegan"].rate_limit


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
    if limiter in _configured:
        return
    # exempt from the host's default and application-wide limits, not from our own
    limiter.exempt(blueprint, flags=ExemptionScope.DEFAULT | ExemptionScope.APPLICATION)
    limiter.shared_limit(_conversion_limit, scope=CONVERSIONS_SCOPE, methods=["POST"],
                         exempt_when=_limit_is_off)(blueprint)
    limiter.request_filter(_form_post_to_refuse)
    _configured.add(limiter)


def adopt_host_limiter(service: Any, app: Flask) -> None:
    """If the host app made its own Limiter after AnimeGAN(app), move our limit to it."""
    host = host_limiter(app, besides=service.limiter)
    if host is None:
        return
    configure(host)
    service.limiter.enabled = False
    log.info("flask_animegan: using the app's own Limiter for the conversion limit")
    service.use_limiter(host)
