"""A forum that renders its pages through Flask-Themes2, to add AnimeGAN to
(tests/test_themes.py).

Its layout is its active theme's: ``themes/lagoon`` has ``info.json``, ``templates/layout.html``
(its own header, ``theme_static('style.css')``, ``theme_get_info('name')``) and
``static/style.css``; the site's own templates extend ``themed_layout.html``, which is
``{% extends theme('layout.html') %}``. Those calls need the theme manager's context (the
``_theme`` variable that ``render_theme_template`` sets), so the extension's pages render
through :func:`render_in_theme` (ANIMEGAN_RENDER_TEMPLATE), as docs/integration.md shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flask_themes2
from flask import Flask, current_app
from flask_themes2 import Themes, get_theme, render_theme_template

from flask_animegan import AnimeGAN

#: The theme the site runs (a site might keep one per user instead).
THEME = "lagoon"


def render_in_theme(template_name: str, **context: Any) -> str:
    """ANIMEGAN_RENDER_TEMPLATE of the site: render through the active theme."""
    return render_theme_template(get_theme(current_app.config["SITE_THEME"]), template_name,
                                 **context)


def create_app(models_dir: Path | str, **config: Any) -> Flask:
    """The forum, with AnimeGAN at ``/anime`` in its theme; ``config`` overrides its settings."""
    app = Flask(__name__)
    app.config.update({
        "SECRET_KEY": "forum secret",
        "SITE_THEME": THEME,
        "ANIMEGAN_URL_PREFIX": "/anime",
        "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_BASE_TEMPLATE": "themed_layout.html",
        "ANIMEGAN_CONTENT_BLOCK": "content",
        "ANIMEGAN_RENDER_TEMPLATE": render_in_theme,
        **config,
    })
    # Flask-Themes2 adds its static route to one blueprint of its module each time it is set
    # up, which Flask refuses once that blueprint is registered on an app: the tests make
    # several apps in one process, so each gets a fresh one.
    flask_themes2.themes_blueprint = flask_themes2._ThemesBlueprint("_themes",
                                                                    flask_themes2.__name__)
    Themes(app, app_identifier="theme_site")
    AnimeGAN(app)

    @app.get("/")
    def home() -> str:
        return render_in_theme("home.html")

    AnimeGAN.warm_up(app)  # as gunicorn.conf.py does in each worker
    return app

