"""Who a request comes from: the key for the rate limit and for the cache's scope."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from flask import current_app, request


def client_address() -> str:
    """The client's address.

    ``X-Forwarded-For`` is used only with ``ANIMEGAN_TRUSTED_PROXIES`` = N > 0, and then
    only the address the outermost of those N proxies saw (as Werkzeug's ProxyFix does),
    so a client cannot pick its own identity by sending the header. The proxies must be
    the only way in: a client that reaches the server directly can still send any
    well-formed address. Entries that are not IP addresses are refused, and the
    request is keyed on the socket's peer address instead.
    """
    hops = current_app.config.get("ANIMEGAN_TRUSTED_PROXIES") or 0
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


def client_key(limiter: object | None) -> str:
    """The rate limit's key for this request: the host's Limiter's key function, if any."""
    key_func: Callable[[], str] | None = getattr(limiter, "_key_func", None)
    if key_func is not None:
        try:
            return str(key_func())
        except Exception:  # noqa: BLE001 - a host key function that fails: fall back
            pass
    return client_address()


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
