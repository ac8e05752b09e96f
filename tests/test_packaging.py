"""The package as pip installs it.

The sdist and the wheel build (the wheel from the sdist, as ``python -m build`` does) and
pass ``twine check``; the wheel carries the shipped style and its licence; installed into
a fresh environment, it serves an app made in another folder with no settings; and the
light modules import on every Python version on this machine.
"""

from __future__ import annotations

import configparser
import email
import glob
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import REPO, need
from venvs import borrowing_venv, clean_env, gunicorn, pip_install, run

from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR

pytestmark = pytest.mark.packaging

SHIPPED_FILES = ("toon_demo.pt", "toon_demo.json", "LICENSE", "README.md",
                 "toon_demo_samples.jpg")


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """sdist and wheel, built with this venv's setuptools (no build isolation, no network)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, REPO)
    (sdist,), (wheel,) = out.glob("*.tar.gz"), out.glob("*.whl")
    return Dists(sdist, wheel)


def test_the_sdist_and_the_wheel_pass_twine_check(dists: Dists) -> None:
    output = run(sys.executable, "-m", "twine", "check", "--strict", dists.sdist, dists.wheel)
    assert output.count("PASSED") == 2, output


def test_the_wheel_carries_the_shipped_style_and_its_licences(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
        for name in SHIPPED_FILES:
            data = wheel.read(f"flask_animegan/shipped_styles/{name}")
            assert data == (SHIPPED_STYLES_DIR / name).read_bytes(), name
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
    # the licences, also where tools that list a wheel's licences look
    assert {f"{info}/licenses/LICENSE",
            f"{info}/licenses/flask_animegan/shipped_styles/LICENSE"} <= names
    assert metadata["License-Expression"] == "MIT"
    assert "MIT License" in (SHIPPED_STYLES_DIR / "LICENSE").read_text()
    assert {"flask_animegan/py.typed", "flask_animegan/templates/animegan/index.html",
            "flask_animegan/static/animegan.js"} <= names
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "bench/"))]
    with tarfile.open(dists.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"flask_animegan/shipped_styles/toon_demo.pt", "LICENSE", "MANIFEST.in",
            "models/README.md", "docs/configuration.md", "example_app/__init__.py"} <= members
    assert not [m for m in members if m.startswith("tests/")]


def test_the_classifiers_are_valid_and_name_the_supported_versions() -> None:
    from trove_classifiers import classifiers as known

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    listed = [line.strip() for line in config["metadata"]["classifiers"].splitlines()
              if line.strip() and not line.strip().startswith("#")]
    assert set(listed) <= known, set(listed) - known
    versions = supported_versions()
    assert config["options"]["python_requires"] == ">=3.10" and versions[0] == (3, 10)
    assert versions == [(3, minor) for minor in range(10, versions[-1][1] + 1)]  # no gaps


# -- installed from the wheel --------------------------------------------------------------
HOST_APP = """\
from flask import Flask

from flask_animegan import AnimeGAN

app = Flask(__name__)
app.config["SECRET_KEY"] = "a packaging test"  # the form's CSRF token needs one
AnimeGAN(app)
"""

CONVERT = """\
import io, json
from PIL import Image
from skimage import data
import flask_animegan
from host import app

photo = io.BytesIO()
Image.fromarray(data.astronaut()).save(photo, "JPEG")
response = app.test_client().post(
    "/animegan/convert?size=128", data={"image": (io.BytesIO(photo.getvalue()), "me.jpg")})
print(json.dumps({
    "package": flask_animegan.__file__,
    "models_dir": str(app.extensions["animegan"].engine.models_dir),
    "status": response.status_code, "type": response.content_type,
    "style": response.headers.get("X-AnimeGAN-Style"),
    "size": Image.open(io.BytesIO(response.data)).size if response.status_code == 200 else None,
}))
"""


def test_the_installed_wheel_converts_a_photo_in_an_app_made_elsewhere(dists: Dists,
                                                                       tmp_path: Path) -> None:
    """pip-installed, with no settings and no models folder: the shipped style converts."""
    venv = tmp_path / "venv"
    # torch, Flask and the rest come from this test venv (tests/venvs.py)
    python = borrowing_venv(venv)
    pip_install(python, "--no-deps", "--no-index", dists.wheel)

    site = tmp_path / "site"  # the host app's folder
    site.mkdir()
    (site / "host.py").write_text(HOST_APP)
    elsewhere = tmp_path / "elsewhere"  # the current directory: not the app's
    elsewhere.mkdir()
    answer = json.loads(run(python, "-c", CONVERT, cwd=elsewhere,
                            env=clean_env(PYTHONPATH=str(site))))
    assert Path(answer["package"]).is_relative_to(venv), answer
    # the models folder is the app's (its root_path), whatever the current directory
    assert answer["models_dir"] == str(site / "models") and not (site / "models").exists()
    assert answer["status"] == 200, answer
    assert answer["type"] == "image/jpeg" and answer["style"] == "toon_demo"
    assert answer["size"] == [128, 128]

    styles = run(python, "-m", "flask", "--app", "host", "animegan", "styles", cwd=site,
                 env=clean_env())
    assert re.search(r"^toon_demo +installed, default$", styles, re.MULTILINE), styles


SERVED_APP = """\
import flask_animegan
from flask import Flask

from flask_animegan import AnimeGAN

app = Flask(__name__)
app.config["SECRET_KEY"] = "a packaging test"


@app.get("/where")
def where():
    return {"package": flask_animegan.__file__}


AnimeGAN(app)
"""


def test_the_installed_wheel_serves_with_its_own_gunicorn_settings(dists: Dists,
                                                                   tmp_path: Path) -> None:
    """README's step 2 from a pip install: ``gunicorn -c python:flask_animegan.gunicorn_conf
    app:app`` in a folder of the site's own (no gunicorn.conf.py there), and a conversion."""
    from PIL import Image
    from skimage import data

    venv = tmp_path / "venv"
    python = borrowing_venv(venv)
    pip_install(python, "--no-deps", "--no-index", dists.wheel)
    site = tmp_path / "site"
    site.mkdir()
    (site / "app.py").write_text(SERVED_APP)
    photo = io.BytesIO()
    Image.fromarray(data.astronaut()).save(photo, "JPEG")
    with gunicorn(python, ["-c", "python:flask_animegan.gunicorn_conf", "app:app"], site,
                  tmp_path / "gunicorn.log", env={"ANIMEGAN_ACCESS_LOG": ""}) as url:
        package = requests.get(f"{url}/where", timeout=10).json()["package"]
        assert Path(package).is_relative_to(venv), package
        response = requests.post(f"{url}/animegan/convert?size=128", timeout=120,
                                 files={"image": ("me.jpg", photo.getvalue())})
        assert response.status_code == 200, response.text
        assert response.headers["Content-Type"] == "image/jpeg"
        assert response.headers["X-AnimeGAN-Style"] == "toon_demo"
        assert Image.open(io.BytesIO(response.content)).size == (128, 128)
    log = (tmp_path / "gunicorn.log").read_text()
    # the package's settings were used: its gthread worker and its one-line startup log
    assert "Using worker: gthread" in log, log[-2000:]
    assert "/result/" not in log


# -- every Python version on this machine ----------------------------------------------------
SMOKE = """\
import io, sys
from PIL import Image
import flask_animegan
from flask_animegan.config import Settings, from_environ
from flask_animegan.inputs.decoding import DecodeLimits, decode_upload

Settings.from_config({})
assert from_environ({"ANIMEGAN_MAX_SIDE": "384"}) == {"ANIMEGAN_MAX_SIDE": 384}
photo = io.BytesIO()
Image.new("RGB", (300, 200), (200, 120, 40)).save(photo, "JPEG")
image = decode_upload(photo.getvalue(), DecodeLimits(), size=150).image
assert image.mode == "RGB" and image.size == (150, 100), image.size
assert "torch" not in sys.modules and "flask" not in sys.modules
print(flask_animegan.__file__)
"""


def supported_versions() -> list[tuple[int, int]]:
    """The Python versions setup.cfg's classifiers name."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    found = re.findall(r"Programming Language :: Python :: 3\.(\d+)",
                       config["metadata"]["classifiers"])
    return sorted((3, int(minor)) for minor in found)


def interpreters() -> Iterator[Path]:
    """Every python3.X on this machine: PATH, the usual prefixes, pyenv's versions."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    patterns = [f"{folder}/python3.*" for folder in os.environ.get("PATH", "").split(":")
                if folder and "shims" not in folder]
    patterns += ["/usr/bin/python3.*", "/usr/local/bin/python3.*",
                 f"{pyenv}/versions/*/bin/python3"]
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            if re.search(r"python3(\.\d+)?$", path) and os.access(path, os.X_OK):
                yield Path(path)


def pythons_by_version() -> dict[tuple[int, int], list[Path]]:
    found: dict[tuple[int, int], list[Path]] = {}
    for path in interpreters():
        try:
            out = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=10,
                                 check=False).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2:
            found.setdefault((int(out[0]), int(out[1])), []).append(path)
    return found


PYTHONS = pythons_by_version()
#: The test venv's own version is covered in full by the wheel install test above.
SMOKE_VERSIONS = sorted((set(supported_versions()) | {v for v in PYTHONS if v >= (3, 10)})
                        - {sys.version_info[:2]})


def prepare_venv(version: tuple[int, int], venv: Path, wheel: Path) -> Path | str:
    """A venv of ``version`` with the wheel, numpy, Pillow and limits (flask-limiter's
    parser, which the settings check uses; the newest pip finds for that version); else why
    not, starting with "skip:" or "need:"."""
    name = f"Python {version[0]}.{version[1]}"
    candidates = PYTHONS.get(version)
    if not candidates:
        return f"skip: {name} is not on this machine"
    for candidate in candidates:  # a Debian python without python3-venv cannot make one
        if subprocess.run([candidate, "-m", "venv", "--without-pip", venv],
                          capture_output=True, timeout=60, check=False).returncode == 0:
            break
    else:
        return f"skip: no {name} here can create a venv: {candidates}"
    python = venv / "bin" / "python"
    # this venv's pip installs into the other one (faster than bootstrapping pip there)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check",
           "--quiet", "install"]
    deps = subprocess.run([*pip, "--only-binary=:all:", "numpy", "pillow>=10.1", "limits"],
                          capture_output=True, text=True, timeout=300, check=False)
    if deps.returncode:
        return (f"need: pip could not install numpy, Pillow and limits for {name}: "
                f"{deps.stderr[-500:]}")
    run(*pip, "--no-deps", wheel)
    return python


@pytest.fixture(scope="module")
def smoke_venvs(dists: Dists, tmp_path_factory: pytest.TempPathFactory,
                ) -> dict[tuple[int, int], Path | str]:
    """Every version's venv, made at once (pip's downloads and installs overlap)."""
    root = tmp_path_factory.mktemp("pythons")
    with ThreadPoolExecutor(max_workers=max(len(SMOKE_VERSIONS), 1)) as pool:
        made = pool.map(lambda v: prepare_venv(v, root / f"py{v[0]}.{v[1]}", dists.wheel),
                        SMOKE_VERSIONS)
        return dict(zip(SMOKE_VERSIONS, made))


@pytest.mark.parametrize("version", SMOKE_VERSIONS, ids=lambda v: f"py{v[0]}.{v[1]}")
def test_the_light_modules_work_on_every_python_here(
        version: tuple[int, int], smoke_venvs: dict[tuple[int, int], Path | str],
        tmp_path: Path) -> None:
    """Config and upload decoding (no torch, no Flask) from the wheel."""
    python = smoke_venvs[version]
    if isinstance(python, str):
        kind, _, reason = python.partition(": ")
        if kind == "skip":
            pytest.skip(reason)
        need(False, reason)
    package = run(python, "-c", SMOKE, cwd=tmp_path, env=clean_env())
    assert Path(package.strip()).is_relative_to(Path(python).parent.parent)
