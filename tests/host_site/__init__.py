"""A small site as people build them, to add AnimeGAN to (tests/test_host_site.py).

An app factory; its own flask-limiter ``Limiter`` with default limits and a limit on one
of its routes; Flask-WTF's global ``CSRFProtect``; its own layout, whose header has a
logout form (``csrf_token()``) and whose inline ``<style>`` and ``<script>`` carry the
nonce of the site's own Content-Security-Policy; the page's block is ``content``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from flask import Flask, g, redirect, render_template, request, url_for
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address
from flask_wtf.csrf import CSRFProtect

from flask_animegan import AnimeGAN

#: The site's policy: nothing inline runs or applies without this response's nonce.
SITE_POLICY = ("default-src 'self'; script-src 'self' 'nonce-{nonce}'; "
               "style-src 'self' 'nonce-{nonce}'; img-src 'self' data: blob:; "
               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def create_app(models_dir: Path | str, *, prefix: str = "/studio", secret: str = "site secret",
               extensions_first: bool = True, site_policy: bool = True,
               default_limits: tuple[str, ...] = ("200 per minute",),
               **config: Any) -> Flask:
    """The site. ``extensions_first``: whether its Limiter and CSRFProtect are made before
    ``AnimeGAN(app)`` (else after). ``site_policy``: whether it sends SITE_POLICY."""
    app = Flask(__name__)
    app.config.update({
        "SECRET_KEY": secret,
        "ANIMEGAN_URL_PREFIX": prefix,
        "ANIMEGAN_BASE_TEMPLATE": "layout.html",
        "ANIMEGAN_CONTENT_BLOCK": "content",
        "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_WARMUP_SIZE": 32,
        **config,
    })

    def make_extensions() -> tuple[Limiter, CSRFProtect]:
        limiter = Limiter(get_remote_address, app=app, storage_uri="memory://",
                          default_limits=list(default_limits))
        return limiter, CSRFProtect(app)

    if extensions_first:
        limiter, csrf = make_extensions()
        AnimeGAN(app)
    else:
        AnimeGAN(app)
        limiter, csrf = make_extensions()
    app.extensions["site"] = {"limiter": limiter, "csrf": csrf}

    @app.before_request
    def make_nonce() -> None:
        g.csp_nonce = secrets.token_urlsafe(16)

    app.jinja_env.globals["csp_nonce"] = lambda: g.get("csp_nonce", "")

    if site_policy:
        @app.after_request
        def send_policy(response):
            response.headers.setdefault("Content-Security-Policy",
                                        SITE_POLICY.format(nonce=g.get("csp_nonce", "")))
            return response

    @app.get("/")
    def home():
        return render_template("home.html")

    @app.post("/logout")
    def logout():
        return redirect(url_for("home", logged_out=1))

    @app.get("/api/ping")
    @limiter.limit("3 per minute")
    def ping():
        return {"pong": True, "from": request.remote_addr}

    AnimeGAN.warm_up(app)  # as gunicorn.conf.py does in each worker
    return app
