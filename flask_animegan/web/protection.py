"""The site's own checks on our routes (ANIMEGAN_PAGE_DECORATORS, _API_DECORATORS,
_ADMIN_CHECK). Every app in the process shares the blueprint's views, so the decorators
wrap a stand-in view run first: they guard, they cannot change a response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Flask, abort, current_app, jsonify, make_response
from werkzeug.utils import ImportStringError, import_string

from ..config import Settings
from . import clients
from .clients import client_address, is_loopback

EXTENSION_KEY = "animegan.protection"
#: The pages a browser opens, and the pictures they show.
PAGE_ENDPOINTS = frozenset({"animegan.index", "animegan.upload", "animegan.result",
                            "animegan.result_image", "animegan.job_page"})
#: The API; /healthz, /metrics and /openapi.json stay open for load balancers and scrapers.
GUARDED_API_ENDPOINTS = frozenset({"animegan.convert", "animegan.styles",
                                   "animegan.style_sample", "animegan.create_job",
                                   "animegan.job", "animegan.cancel_job",
                                   "animegan.job_result", "animegan.job_preview"})
_LET_THROUGH = object()


@dataclass(frozen=True)
class Protection:
    """One app's checks, imported."""

    pages: tuple[Callable[..., Any], ...] = ()
    api: tuple[Callable[..., Any], ...] = ()
    admin_check: Callable[[], Any] | None = None


def imported(key: str, value: Any, example: str = "flask_login.login_required") -> Any:
    """The callable a hook setting names (itself, or imported from its dotted path);
    ValueError names ``key`` and the fix."""
    if callable(value):
        return value
    try:
        found = import_string(value.replace(":", "."))
    except ImportStringError as exc:
        raise ValueError(f"{key}: {value!r} cannot be imported ({exc.exception}); give the "
                         f"dotted path of an installed function, e.g. {example!r}, or the "
                         "function itself") from None
    if not callable(found):
        raise ValueError(  # noqa: TRY004 - init_app turns ValueErrors into its RuntimeError
            f"{key}: {value!r} is a {type(found).__name__}, not a callable; "
                         "give the dotted path of a function")
    return found


def install(app: Flask, settings: Settings) -> None:
    """Import the site's checks and its client key (init_app): one that cannot be
    imported stops the start."""
    app.extensions[EXTENSION_KEY] = Protection(
        pages=tuple(imported("ANIMEGAN_PAGE_DECORATORS", d) for d in settings.page_decorators),
        api=tuple(imported("ANIMEGAN_API_DECORATORS", d) for d in settings.api_decorators),
        admin_check=(None if settings.admin_check is None
                     else imported("ANIMEGAN_ADMIN_CHECK", settings.admin_check)))
    clients.install(app, None if settings.rate_limit_key is None else imported(
        "ANIMEGAN_RATE_LIMIT_KEY", settings.rate_limit_key, example="site.auth.animegan_client"))


def _protection() -> Protection:
    found = current_app.extensions.get(EXTENSION_KEY)
    return found if isinstance(found, Protection) else Protection()


def guard(endpoint: str | None) -> None:
    """Run the site's decorators for ``endpoint``; abort with their answer unless they let
    the request through (on the API a login redirect becomes a 401)."""
    protection = _protection()
    decorators = (protection.pages if endpoint in PAGE_ENDPOINTS
                  else protection.api if endpoint in GUARDED_API_ENDPOINTS else ())
    if not decorators:
        return
    view: Callable[..., Any] = lambda: _LET_THROUGH  # the stand-in view
    for decorator in reversed(decorators):  # listed outermost first, as written above a view
        view = decorator(view)
    answer = current_app.ensure_sync(view)()
    if answer is _LET_THROUGH:
        return
    response = make_response(answer)
    if endpoint in GUARDED_API_ENDPOINTS and 300 <= response.status_code < 400:
        login_url = response.headers.get("Location")
        response = make_response(jsonify(
            error="log in first: this API needs a signed-in session of the site",
            status=401, login_url=login_url), 401)
    abort(response)


def is_admin() -> bool:
    """Whether the visitor runs the site: ANIMEGAN_ADMIN_CHECK, else loopback in debug mode."""
    check = _protection().admin_check
    if check is not None:
        return bool(check())
    return bool(current_app.debug) and is_loopback(client_address())
