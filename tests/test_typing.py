"""Typing: ``AnimeGAN(app, **options)`` options are typed, one per setting; mypy checks them.

``mypy --strict`` over the package runs in ``.ci/run``; here mypy checks a host app's
code: the package's names import (they are re-exported for type checkers), options of
the wrong type or name are errors.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing

import pytest
from conftest import REPO

from flask_animegan.config import AnimeGANOptions, Settings


def test_the_keyword_options_are_the_settings_with_their_types():
    settings = typing.get_type_hints(Settings)
    fields = {f.name: settings[f.name] for f in dataclasses.fields(Settings)}
    assert typing.get_type_hints(AnimeGANOptions) == fields
    assert not AnimeGANOptions.__required_keys__  # every option may be left out


HOST_CODE = """\
from flask import Flask
from flask_animegan import AnimeGAN

app = Flask(__name__)
AnimeGAN(app, max_side=384, default_style=None, extra_styles={})
AnimeGAN(app, max_side="384")
AnimeGAN(app, max_sides=384)
"""


@pytest.mark.slow  # mypy --strict over a host app and, with it, the package: about 8 s
def test_mypy_checks_the_keyword_options():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "-c", HOST_CODE],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stdout.splitlines()
              if line.startswith("<string>:") and ": error:" in line]
    assert len(errors) == 2, result.stdout + result.stderr
    assert ':6: error: Argument "max_side" to "AnimeGAN" has incompatible type "str"' in errors[0]
    assert ':7: error: Unexpected keyword argument "max_sides" for "AnimeGAN"' in errors[1]
