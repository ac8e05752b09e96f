"""The blueprint every part of ``web`` registers on: the views their routes, the CLI its
commands, the limits their preprocessor. Its templates and static files are package data
at the package's top (``templates/animegan/``, ``static/``)."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
blueprint = Blueprint("animegan", __name__, template_folder=_PACKAGE_DIR / "templates",
                      static_folder=_PACKAGE_DIR / "static", cli_group="animegan")
