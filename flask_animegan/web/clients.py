"""Who a request comes from: the key for the rate limit and for the cache's scope."""

from __future__ import annotations

import ipaddress

from flask import current_app, request
from flask_limiter import Limiter

from ..service import get_service

#: The scope of the conversions' shared limit (web/limits.py registers it).
CONVERSIONS_SCOPE = "animegan-conversions"


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
    """The rate limit's key for this request as ``limiter`` counted it, else the address."""
    if limiter is not None:
        for counted in limiter.current_limits:
            # request_args: [key_prefix,] the key function's value, the scope
            if counted.shared and counted.request_args[-1] == CONVERSIONS_SCOPE:
                return str(counted.request_args[-2])
    return client_address()


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
