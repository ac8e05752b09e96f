"""The blueprint every part of ``web`` registers on: the views their routes, the CLI its
commands, the limits their preprocessor. Its templates and static files are package data
at the package's top (``templates/animegan/``, ``static/``)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: Where the static files are served, under the prefix: not ``/static``, which is the host
#: app's own static route when the blueprint is mounted at the site's root
#: (ANIMEGAN_URL_PREFIX="/") and would answer 404 for the page's CSS and script.
STATIC_URL_PATH = "/animegan-static"
blueprint = Blueprint("animegan", __name__, template_folder=_PACKAGE_DIR / "templates",
                      static_folder=_PACKAGE_DIR / "static", static_url_path=STATIC_URL_PATH,
                      cli_group="animegan")
