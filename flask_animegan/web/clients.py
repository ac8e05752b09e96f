"""Who a request comes from: the key for the rate limit and for the cache's scope."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from flask import Flask, current_app, g, request
from flask_limiter import Limiter

from ..service import get_service

#: The scope of the conversions' shared limit (web/limits.py registers it).
CONVERSIONS_SCOPE = "animegan-conversions"
#: Where init_app keeps the site's ANIMEGAN_RATE_LIMIT_KEY, imported.
EXTENSION_KEY = "animegan.client_key"
_DERIVED = "animegan_client"


def install(app: Flask, site_key: Callable[[], Any] | None) -> None:
    """Keep ``app``'s ANIMEGAN_RATE_LIMIT_KEY (imported by init_app; None: unset)."""
    app.extensions[EXTENSION_KEY] = site_key


def has_site_key() -> bool:
    """Whether the current app keys its clients with ANIMEGAN_RATE_LIMIT_KEY."""
    return current_app.extensions.get(EXTENSION_KEY) is not None


def site_key() -> str:
    """ANIMEGAN_RATE_LIMIT_KEY's value for this request, or the client's address where it is
    unset or answers None or ''; derived once per request, so the limit and the cache agree."""
    found: str | None = g.get(_DERIVED)
    if found is None:
        hook = current_app.extensions.get(EXTENSION_KEY)
        value = hook() if hook is not None else None
        # an empty key would make flask-limiter skip the limit: the address instead
        found = str(value) if value is not None and str(value) else client_address()
        setattr(g, _DERIVED, found)
    return found


def client_address() -> str:
    """The client's address: with N trusted proxies, the one the outermost saw (as
    ProxyFix does), so a client cannot pick its identity; else the socket's peer."""
    hops = get_service().settings.trusted_proxies
    if hops:
        chain = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",")]
        chain = [part for part in chain if part]
        if len(chain) >= hops:
            claimed = chain[-hops]
            try:
                return str(ipaddress.ip_address(claimed))
            except ValueError:
                current_app.logger.debug("ignoring malformed X-Forwarded-For entry %r",
                                         claimed[:64])
    return request.remote_addr or "unknown"


def client_key(limiter: Limiter | None) -> str:
    """The rate limit's key for this request as ``limiter`` counted it (the site's key
    function, the host Limiter's, or the address), else :func:`site_key`."""
    if limiter is not None:
        for counted in limiter.current_limits:
            # request_args: [key_prefix,] the key function's value, the scope
            if counted.shared and counted.request_args[-1] == CONVERSIONS_SCOPE:
                return str(counted.request_args[-2])
    return site_key()


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
