"""A small site as people build them, to add AnimeGAN to (tests/test_host_site.py).

An app factory; its own flask-limiter ``Limiter`` with default limits and a limit on one
of its routes; Flask-WTF's global ``CSRFProtect``; its own layout, whose header has a
logout form (``csrf_token()``) and whose inline ``<style>`` and ``<script>`` carry the
nonce of the site's own Content-Security-Policy; the page's block is ``content``.
Optionally (``error_handlers``) the handlers such sites register: a blueprint's
``app_errorhandler(404)`` and ``app_errorhandler(500)`` and the app's
``errorhandler(Exception)``, each answering with its own bare page; and (``login``)
Flask-Login with a login page, two users (``ann``, ``admin``) and ``current_user``.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask, g, redirect, render_template, request, url_for
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
               error_handlers: bool = False, login: bool = False,
               **config: Any) -> Flask:
    """The site. ``extensions_first``: whether its Limiter and CSRFProtect are made before
    ``AnimeGAN(app)`` (else after). ``site_policy``: whether it sends SITE_POLICY.
    ``error_handlers``, ``login``: see the module's docstring."""
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

    if login:
        add_login(app)
    if error_handlers:
        add_error_handlers(app)
    if extensions_first:
        limiter, csrf = make_extensions()
        AnimeGAN(app)
    else:
        AnimeGAN(app)
        limiter, csrf = make_extensions()
    app.extensions["site"] = {"limiter": limiter, "csrf": csrf}
    if login:  # a test site: its login form carries no token
        csrf.exempt(app.view_functions["do_login"])

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


#: What the site's own error handlers answer (tests/test_host_site.py looks for them).
SITE_NOT_FOUND, SITE_ERROR, SITE_EXCEPTION = ("Site: page not found", "Site: server error",
                                              "Site: something went wrong")


def add_error_handlers(app: Flask) -> None:
    """The handlers of the tutorial site: a blueprint's app-wide 404 and 500 handlers, and
    the app's catch-all for exceptions."""
    errors = Blueprint("site_errors", __name__)

    @errors.app_errorhandler(404)
    def not_found(error):
        return SITE_NOT_FOUND, 404

    @errors.app_errorhandler(500)
    def server_error(error):
        return SITE_ERROR, 500

    app.register_blueprint(errors)

    @app.errorhandler(Exception)
    def anything(error):
        return SITE_EXCEPTION, 500

    @app.get("/site/broken")
    def broken():
        raise RuntimeError("a bug of the site's own")


#: The site's users (id -> whether an administrator).
USERS = {"ann": False, "admin": True}


def add_login(app: Flask) -> None:
    """Flask-Login as the tutorial site has it: a login page (``login_view``), users loaded
    from the session; POST /login?user=ann logs in (a test site: no password)."""
    from flask_login import (
        LoginManager,
        UserMixin,
        current_user,
        login_user,
        logout_user,
    )

    class User(UserMixin):
        def __init__(self, user_id: str) -> None:
            self.id = user_id
            self.is_admin = USERS[user_id]

    manager = LoginManager(app)
    manager.login_view = "login"

    @manager.user_loader
    def load(user_id: str):
        return User(user_id) if user_id in USERS else None

    @app.get("/login")
    def login():
        return f"<h1>Log in</h1><p>next: {request.args.get('next', '')}</p>"

    @app.post("/login")
    def do_login():
        login_user(User(request.args["user"]))
        return redirect(request.args.get("next") or url_for("home"))

    @app.post("/site-logout")
    def site_logout():
        logout_user()
        return redirect(url_for("home"))

    app.jinja_env.globals["current_user"] = current_user


def is_site_admin() -> bool:
    """ANIMEGAN_ADMIN_CHECK of the site: its logged-in administrators."""
    from flask_login import current_user

    return bool(current_user.is_authenticated and current_user.is_admin)
