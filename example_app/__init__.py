"""An "existing site" that adds photo-to-anime conversion in a few lines.

Run it with ``gunicorn -c gunicorn.conf.py example_app:app`` (see the README).
Every ``ANIMEGAN_*`` environment variable is passed to the extension.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from flask import Flask, render_template_string, url_for

from flask_animegan import AnimeGAN
from flask_animegan.config import from_environ

REPO_MODELS = Path(__file__).resolve().parent.parent / "models"

HOME = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Example site</title></head>
<body><h1>Example site</h1>
<p>This is a site of its own that added <code>AnimeGAN(app)</code>.</p>
<ul><li><a href="{{ url_for('animegan.index') }}">Turn a photo into anime</a></li>
<li><a href="{{ url_for('about') }}">About this site</a></li></ul></body></html>"""


def create_app(config: dict | None = None) -> Flask:
    app = Flask(__name__)
    app.config["ANIMEGAN_MODELS_DIR"] = str(REPO_MODELS)
    app.config.from_prefixed_env()  # FLASK_SECRET_KEY and the like
    app.config.update(from_environ(os.environ))
    app.config.update(config or {})
    if not app.config.get("SECRET_KEY"):
        # Sessions (and so the upload form's CSRF token) need a key. A random one is
        # fine for one worker process; with several workers or hosts, set
        # FLASK_SECRET_KEY to one shared value.
        app.config["SECRET_KEY"] = secrets.token_hex(32)

    @app.get("/")
    def home() -> str:
        return render_template_string(HOME)

    @app.get("/about")
    def about() -> dict:
        return {"site": "example", "converter": url_for("animegan.index")}

    AnimeGAN(app)
    return app


def __getattr__(name: str) -> Flask:
    # `example_app:app` for gunicorn and `flask --app example_app`, built on first use
    # so that importing create_app (tests) does not load a model.
    if name == "app":
        globals()["app"] = create_app()
        return globals()["app"]
    raise AttributeError(name)
