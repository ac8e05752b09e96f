"""The lowest versions setup.cfg claims for Flask, Werkzeug, flask-limiter and gunicorn.

A fresh venv gets exactly those versions from the index (pip), borrows everything else
from this test venv (tests/venvs.py), and then: installing the wheel keeps the pins (a site
that pins them is not upgraded); the Flask-client tests of the views, the extension, the
host site, the protection hooks and the limits pass under them; and a real gunicorn of
that version serves the example app with the shipped settings and converts a photo.
About 70 s on 2 cores (pip downloads the four wheels, 1.3 MB, from the index).
"""

from __future__ import annotations

import configparser
import io
import json
import re
import sys
from pathlib import Path

import pytest
import requests
from conftest import REPO, photo_bytes
from venvs import borrowing_venv, clean_env, gunicorn, pip_install, run

pytestmark = pytest.mark.packaging

#: The distributions whose lowest versions are tested, and where setup.cfg names them.
CHECKED = {"flask": "install_requires", "werkzeug": "install_requires",
           "flask-limiter": "install_requires", "gunicorn": "server"}
#: The Flask-client tests run under the lowest versions (a bare pytest's selection of them).
CLIENT_TESTS = ("tests/test_views.py", "tests/test_extension.py", "tests/test_host_site.py",
                "tests/test_protection.py", "tests/test_fair_limits.py")


def lowest_versions() -> dict[str, str]:
    """``name: version`` from each ``name>=version`` line setup.cfg has for CHECKED."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    found = {}
    for name, where in CHECKED.items():
        section = (config["options"]["install_requires"] if where == "install_requires"
                   else config["options.extras_require"][where])
        match = re.search(rf"^\s*{re.escape(name)}>=([\w.]+)\s*$", section, re.MULTILINE | re.IGNORECASE)
        assert match, f"setup.cfg's {where} has no '{name}>=X' line"
        found[name] = match.group(1)
    return found


LOWEST = lowest_versions()


@pytest.fixture(scope="module")
def lowest_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the lowest versions installed from the index, the rest borrowed."""
    python = borrowing_venv(tmp_path_factory.mktemp("lowest") / "venv")
    pip_install(python, *(f"{name}=={version}" for name, version in LOWEST.items()))
    return python


def installed(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))")
    return json.loads(run(python, "-c", code, *LOWEST))


def test_the_bounds_are_a_host_sites_pins_or_lower() -> None:
    """A host site pinning Flask 3.0.0, Werkzeug 3.0.1 and gunicorn 21.2.0 can install us."""
    from packaging.version import Version

    host = {"flask": "3.0.0", "werkzeug": "3.0.1", "gunicorn": "21.2.0"}
    assert all(Version(LOWEST[name]) <= Version(pin) for name, pin in host.items()), LOWEST


def test_installing_the_wheel_keeps_a_sites_pins(lowest_python: Path,
                                                  tmp_path: Path) -> None:
    run(sys.executable, "-m", "pip", "wheel",
        "--no-deps", "--no-build-isolation", "--quiet", "-w", tmp_path, REPO, timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    pip_install(lowest_python, "--no-index", wheel)
    assert installed(lowest_python) == LOWEST


def test_the_flask_client_tests_pass_on_the_lowest_versions(lowest_python: Path) -> None:
    assert installed(lowest_python) == LOWEST
    result = run(lowest_python, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                 *CLIENT_TESTS,
                 cwd=REPO, env=clean_env(PYTHONPATH=str(REPO)), timeout=600)
    assert re.search(r"\d+ passed", result), result[-2000:]


def test_gunicorn_of_the_lowest_version_serves_and_converts(lowest_python: Path,
                                                            tmp_path: Path) -> None:
    log = tmp_path / "gunicorn.log"
    with gunicorn(lowest_python, ["-c", "gunicorn.conf.py", "example_app:app"], REPO, log,
                  env={"ANIMEGAN_ACCESS_LOG": "", "PYTHONPATH": str(REPO)}) as url:
        response = requests.post(f"{url}/animegan/convert?size=128", timeout=120,
                                 files={"image": ("me.jpg", photo_bytes("astronaut"))})
        assert response.status_code == 200, response.text
        from PIL import Image

        assert Image.open(io.BytesIO(response.content)).size == (128, 128)
    assert f"Starting gunicorn {LOWEST['gunicorn']}" in log.read_text(), log.read_text()[-2000:]
