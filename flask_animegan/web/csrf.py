"""CSRF protection of the upload form: Flask-WTF's when the app has it, else our own
token in the signed session (closed without a ``SECRET_KEY``). The JSON API needs none:
it reads no cookie and changes nothing of the visitor's (docs/integration.md)."""

from __future__ import annotations

import hmac
import secrets
import sys
import weakref
from collections.abc import Callable
from typing import Any

from flask import current_app, g, request, session

from ..errors import ConversionError
from ..service import get_service

SESSION_KEY = "animegan_csrf"
FIELD = "csrf_token"
HEADER = "X-CSRF-Token"
#: What a refused form post says, whichever token was missing or wrong.
REFUSED = ("the form has expired or was sent from another site: reload the page and "
           "send the photo again")
_exempted: weakref.WeakSet[Any] = weakref.WeakSet()


class CsrfFailed(ConversionError):
    status = 400


def host_protect() -> Any | None:
    """The app's Flask-WTF ``CSRFProtect``, or None when it has none."""
    protect = current_app.extensions.get("csrf")
    flask_wtf = _flask_wtf_csrf()
    return protect if flask_wtf and isinstance(protect, flask_wtf.CSRFProtect) else None


def _flask_wtf_csrf() -> Any:
    """The module flask_wtf.csrf if the process imported it (else no app uses it), or None."""
    return sys.modules.get("flask_wtf.csrf")


def _host_check_enabled() -> bool:
    return bool(current_app.config.get("WTF_CSRF_ENABLED", True))


def exempt_from_host(view: Callable[..., Any]) -> None:
    """Exempt ``view`` from the app's Flask-WTF check; per request, so that a
    CSRFProtect made after ``AnimeGAN(app)`` is covered too."""
    protect = host_protect()
    if protect is not None and protect not in _exempted:
        protect.exempt(view)
        _exempted.add(protect)


def enabled() -> bool:
    """Whether the extension's own token is on (it is used only where Flask-WTF is not)."""
    return get_service().settings.csrf


def token() -> str | None:
    """This browser session's own token (created on first use), or None when it is off."""
    if not enabled():
        return None
    value = session.get(SESSION_KEY)
    if not isinstance(value, str):
        value = session[SESSION_KEY] = secrets.token_urlsafe(32)
    return value


def form_field() -> tuple[str, str] | None:
    """The hidden field the upload form carries: (name, value), or None when it needs none."""
    if host_protect() is not None:
        if not _host_check_enabled():
            return None
        return (current_app.config.get("WTF_CSRF_FIELD_NAME", FIELD),
                _flask_wtf_csrf().generate_csrf())
    value = token()
    return None if value is None else (FIELD, value)


def check() -> None:
    """Refuse the request unless it carries the form's token (Flask-WTF's, else ours)."""
    protect = host_protect()
    if protect is not None:
        if _host_check_enabled() and not g.get("csrf_valid"):
            protect.protect()
        return
    if not enabled():
        return
    expected = session.get(SESSION_KEY)
    if request.mimetype == "multipart/form-data":
        sent = request.form.get(FIELD, "")
    else:
        sent = request.headers.get(HEADER, "")
    if not isinstance(expected, str) or not hmac.compare_digest(expected.encode(),
                                                                 sent.encode()):
        raise CsrfFailed(REFUSED)


def passes() -> bool:
    """Whether this request would pass :func:`check` (never raises)."""
    flask_wtf = _flask_wtf_csrf()
    try:
        check()
    except CsrfFailed:
        return False
    except Exception as exc:  # noqa: BLE001 - Flask-WTF's refusal; anything else propagates
        if flask_wtf is not None and isinstance(exc, flask_wtf.CSRFError):
            return False
        raise
    return True


def is_host_refusal(error: Exception) -> bool:
    """Whether ``error`` is Flask-WTF's refusal of a request (its ``CSRFError``)."""
    flask_wtf = _flask_wtf_csrf()
    return flask_wtf is not None and isinstance(error, flask_wtf.CSRFError)
