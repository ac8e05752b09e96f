"""The README and docs/ stay true to the code: config table, setting names, documented routes."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from flask import Flask

from flask_animegan.config import ALIASES, REGISTRY
from flask_animegan.runtime.catalog import OFFICIAL_STYLES

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((REPO / "docs").glob("*.md"))}
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"
NAME = re.compile(r"\bANIMEGAN_[A-Z0-9_]*[A-Z0-9]\b")
ROUTE_HEADING = re.compile(r"^### `(GET|POST|DELETE) (/[^`\s]*)`$", re.MULTILINE)
CURL_URL = re.compile(r"https?://127\.0\.0\.1:8000(/[^\s'\"?)]*)")
PLACEHOLDER = re.compile(r"<[^>]+>")


def api_section() -> str:
    return DOCS["http-api.md"]


def test_config_table_matches_generator() -> None:
    generated = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_config_table.py")],
        check=True, capture_output=True, text=True, cwd=REPO,
    ).stdout.strip()
    page = DOCS["configuration.md"]
    assert page.count(START) == 1 and page.count(END) == 1
    in_page = page.split(START, 1)[1].split(END, 1)[0].strip()
    assert in_page == generated, (
        "docs/configuration.md's table is out of date; run "
        "`.venv/bin/python tools/gen_config_table.py --write`")


def outside_old_names_table(text: str) -> str:
    """``text`` without docs/configuration.md's generated tables, the one place where an
    old setting name belongs."""
    if START not in text:
        return text
    head, rest = text.split(START, 1)
    return head + rest.split(END, 1)[1]


def stale_names(text: str, known: set[str]) -> list[str]:
    """``ANIMEGAN_*`` names in ``text`` that are no setting, old names included (outside
    the generated tables)."""
    return sorted(set(NAME.findall(outside_old_names_table(text))) - known)


def known_names(app: Flask) -> set[str]:
    """Every setting name of today: the registry's, gunicorn_conf.py's and app.config's."""
    gunicorn_names = set(NAME.findall(
        (REPO / "flask_animegan" / "gunicorn_conf.py").read_text(encoding="utf-8")))
    # app.config holds the settings and nothing else of ours (no runtime state)
    app_names = {key for key in app.config if key.startswith("ANIMEGAN_")}
    return ({s.name for s in REGISTRY} | gunicorn_names | app_names) - set(ALIASES)


def test_every_setting_name_in_readme_exists(make_app: Callable[..., Flask]) -> None:
    known = known_names(make_app())
    stale = {name: found for name, text in [("README.md", README), *DOCS.items()]
             if (found := stale_names(text, known))}
    assert not stale, (
        f"README.md or docs/ mention settings that do not exist (an old name belongs only "
        f"in docs/configuration.md's generated table): {stale}")


def test_an_old_name_outside_the_table_is_reported(make_app: Callable[..., Flask]) -> None:
    known = known_names(make_app())
    page = DOCS["configuration.md"]
    assert "`ANIMEGAN_BIND`" in page.split(START, 1)[1]
    assert stale_names(page, known) == []
    assert stale_names(page + "\nSet `ANIMEGAN_BIND` to listen elsewhere.\n", known) == [
        "ANIMEGAN_BIND"]
    assert stale_names(page.replace(START, ""), known) == sorted(ALIASES)


def _normalise(rule: str) -> str:
    return PLACEHOLDER.sub("<>", rule)


def test_documented_routes_exist(make_app: Callable[..., Flask]) -> None:
    app = make_app()
    rules = {(_normalise(r.rule), method) for r in app.url_map.iter_rules()
             for method in r.methods or ()}
    documented = ROUTE_HEADING.findall(api_section())
    assert documented, "no '### `METHOD /path`' headings found in the HTTP API section"
    missing = [f"{m} {p}" for m, p in documented if (_normalise(p), m) not in rules]
    assert not missing, f"docs/http-api.md documents routes the app does not have: {missing}"

    adapter = app.url_map.bind("127.0.0.1:8000")
    for path in CURL_URL.findall(api_section()):
        adapter.match(PLACEHOLDER.sub("TOKEN", path), method="POST" if path.endswith(
            ("/upload", "/convert")) else "GET")  # raises NotFound for an unknown path


def test_every_blueprint_route_is_documented(make_app: Callable[..., Flask]) -> None:
    documented = {(m, _normalise(p)) for m, p in ROUTE_HEADING.findall(api_section())}
    undocumented = [
        f"{method} {rule.rule}"
        for rule in make_app().url_map.iter_rules()
        if rule.endpoint.startswith("animegan.") and rule.endpoint != "animegan.static"
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"})
        if (method, _normalise(rule.rule)) not in documented
    ]
    assert not undocumented, f"routes missing from docs/http-api.md: {undocumented}"


def test_official_style_pins_in_readme() -> None:
    for style in OFFICIAL_STYLES.values():
        assert f"| `{style.name}` |" in DOCS["styles.md"] and style.sha1 in DOCS["styles.md"], \
            style.name


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def test_install_page_gives_each_installer_pytorchs_cpu_index() -> None:
    """docs/install.md: uv's block parses and sends torch, and only torch, to the CPU index;
    pip and Poetry name the same index, and the README points there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    page = DOCS["install.md"]
    (block,) = re.findall(r"^```toml\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    uv = tomllib.loads(block)["tool"]["uv"]
    assert uv["index"] == [{"name": "pytorch-cpu", "url": CPU_INDEX, "explicit": True}]
    assert uv["sources"] == {"torch": [{"index": "pytorch-cpu"}]}
    for command in (f"pip install torch --index-url {CPU_INDEX}", "uv add torch",
                    f"poetry source add --priority explicit pytorch-cpu {CPU_INDEX}",
                    "poetry add --source pytorch-cpu torch"):
        assert command in page, command
    assert "[docs/install.md](docs/install.md)" in README
