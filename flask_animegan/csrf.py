"""A CSRF token for the upload form, on when the host app has a ``SECRET_KEY``.

The token is a random value kept in Flask's signed session cookie and repeated in
a hidden form field; a form posted from another site cannot know it. Apps without
a secret key have no session, so the form goes without (``ANIMEGAN_CSRF`` turns
the check off where the host app already protects every form, e.g. Flask-WTF).
The JSON API (``/convert``) needs no token: it keeps no state for the client, and
another site's page cannot read its answer.
"""

from __future__ import annotations

import hmac
import secrets

from flask import current_app, request, session

from .errors import ConversionError

SESSION_KEY = "animegan_csrf"
FIELD = "csrf_token"
HEADER = "X-CSRF-Token"


class CsrfFailed(ConversionError):
    status = 400


def enabled() -> bool:
    return bool(current_app.config.get("ANIMEGAN_CSRF") and current_app.secret_key)


def token() -> str | None:
    """This browser session's token (created on first use), or None when CSRF is off."""
    if not enabled():
        return None
    value = session.get(SESSION_KEY)
    if not isinstance(value, str):
        value = session[SESSION_KEY] = secrets.token_urlsafe(32)
    return value


def check() -> None:
    """Raise CsrfFailed unless the request carries this session's token.

    The token comes in the form field ``csrf_token`` of a multipart form, or else in
    the ``X-CSRF-Token`` header (the body of any other request is the image itself).
    """
    if not enabled():
        return
    expected = session.get(SESSION_KEY)
    if request.mimetype == "multipart/form-data":
        sent = request.form.get(FIELD, "")
    else:
        sent = request.headers.get(HEADER, "")
    if not isinstance(expected, str) or not hmac.compare_digest(expected.encode(),
                                                                 sent.encode()):
        raise CsrfFailed("the form has expired or was sent from another site: reload the "
                         "page and send the photo again")
