"""Licences as SPDX identifiers with links, and ANIMEGAN_ALLOWED_LICENCES: a style under
another licence is not served, not listed, not the default and not exported.
(``pull`` of one: tests/test_pull.py, against a real HTTP server.)"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import convert, photo_bytes, save_random_generator
from flask import Flask

from flask_animegan.config import from_environ
from flask_animegan.runtime.catalog import NONCOMMERCIAL, OFFICIAL_STYLES

MIT_PORTS = {name for name, style in OFFICIAL_STYLES.items() if style.licence == "MIT"}


@pytest.fixture
def with_paprika(tmp_path: Path, models_dir: Path) -> Path:
    """The test styles plus a ``paprika.pt`` (seeded random weights): the catalogue
    describes it as the non-commercial official style."""
    folder = tmp_path / "models"
    shutil.copytree(models_dir, folder)
    save_random_generator(folder / "paprika.pt", seed=3)
    return folder


def names(app: Flask) -> dict[str, dict[str, object]]:
    body = app.test_client().get("/animegan/styles").json
    return {style["name"]: style for style in body["styles"]}


def test_the_licences_are_spdx_ids_with_links(make_app: Callable[..., Flask]) -> None:
    styles = names(make_app(ANIMEGAN_SHIPPED_STYLES=True))
    assert styles["paprika"]["licence"] == NONCOMMERCIAL == "LicenseRef-AnimeGANv2-NonCommercial"
    assert styles["paprika"]["licence_url"] == (
        "https://github.com/TachibanaYoshino/AnimeGANv2#license")
    for name in MIT_PORTS | {"toon_demo"}:
        assert styles[name]["licence"] == "MIT"
        assert styles[name]["licence_url"] == "https://spdx.org/licenses/MIT.html"
    assert styles["test_style"]["licence"] == "own"  # a file put into the models folder
    assert styles["test_style"]["licence_url"] is None


def test_a_non_allowed_default_stops_the_app_naming_it(
        make_app: Callable[..., Flask], with_paprika: Path) -> None:
    for folder in (with_paprika, None):  # installed, and only pullable
        config = {"ANIMEGAN_MODELS_DIR": str(folder)} if folder else {}
        with pytest.raises(RuntimeError) as error:
            make_app(ANIMEGAN_ALLOWED_LICENCES=["MIT"], ANIMEGAN_DEFAULT_STYLE="paprika",
                     **config)
        message = str(error.value)
        assert "ANIMEGAN_DEFAULT_STYLE='paprika'" in message
        assert NONCOMMERCIAL in message and "ANIMEGAN_ALLOWED_LICENCES" in message
        assert "(allowed: MIT)" in message


def test_a_non_allowed_portrait_scene_style_stops_the_app(
        make_app: Callable[..., Flask], with_paprika: Path) -> None:
    with pytest.raises(RuntimeError, match=(
            f"ANIMEGAN_PORTRAIT_SCENE_STYLE='paprika' has the licence {NONCOMMERCIAL}")):
        make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_ALLOWED_LICENCES=["own"],
                 ANIMEGAN_PORTRAIT_SCENE_STYLE="paprika")


def test_the_automatic_default_skips_a_non_allowed_style(
        make_app: Callable[..., Flask], with_paprika: Path) -> None:
    # paprika is the preferred default when installed, but not under an MIT-only policy
    everything = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_SHIPPED_STYLES=True)
    assert everything.extensions["animegan"].engine.default_style == "paprika"
    mit = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_SHIPPED_STYLES=True,
                   ANIMEGAN_ALLOWED_LICENCES=["MIT"])
    assert mit.extensions["animegan"].engine.default_style == "toon_demo"


def test_styles_the_page_and_openapi_list_only_allowed_ones(
        make_app: Callable[..., Flask], with_paprika: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_SHIPPED_STYLES=True,
                   ANIMEGAN_ALLOWED_LICENCES=["mit"])  # SPDX ids match in any case
    assert set(names(app)) == MIT_PORTS | {"toon_demo"}
    client = app.test_client()
    spec = client.get("/animegan/openapi.json").json
    style = next(p for p in spec["paths"]["/animegan/convert"]["post"]["parameters"]
                 if p["name"] == "style")
    assert style["schema"]["enum"] == ["toon_demo"]
    assert style["x-licences"] == {"toon_demo": {
        "licence": "MIT", "url": "https://spdx.org/licenses/MIT.html"}}
    assert "toon_demo MIT <https://spdx.org/licenses/MIT.html>" in style["description"]
    page = client.get("/animegan/").get_data(as_text=True)
    assert '<a class="animegan-licence" href="https://spdx.org/licenses/MIT.html"' in page
    assert 'value="toon_demo"' in page and "<strong>toon_demo</strong>" in page
    for name in ("test_style", "paprika"):
        assert f'value="{name}"' not in page and f"<strong>{name}</strong>" not in page

    own = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_SHIPPED_STYLES=True,
                   ANIMEGAN_ALLOWED_LICENCES=["own", NONCOMMERCIAL])
    assert set(names(own)) == {"test_style", "other_style", "paprika"}


def test_a_non_allowed_style_is_not_served(make_app: Callable[..., Flask],
                                           with_paprika: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_ALLOWED_LICENCES=["own"])
    client = app.test_client()
    for name in ("paprika", "face_paint_512_v2"):  # installed, and only pullable
        answer = convert(client, photo_bytes(), f"?style={name}")
        assert answer.status_code in (400, 404), answer.status_code
        assert "ANIMEGAN_ALLOWED_LICENCES" in answer.json["error"]
    assert client.get("/animegan/styles/paprika/sample").status_code == 404
    assert convert(client, photo_bytes(), "?style=test_style&size=32").status_code == 200


def test_styles_command_names_the_refused(make_app: Callable[..., Flask],
                                          with_paprika: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_ALLOWED_LICENCES=["own"])
    output = app.test_cli_runner().invoke(args=["animegan", "styles"]).output
    assert (f"paprika              NOT ALLOWED: licence {NONCOMMERCIAL} is not among "
            "ANIMEGAN_ALLOWED_LICENCES") in output
    assert "test_style           installed" in output


def test_export_of_a_non_allowed_style_refuses(make_app: Callable[..., Flask],
                                               with_paprika: Path, tmp_path: Path) -> None:
    app = make_app(ANIMEGAN_MODELS_DIR=str(with_paprika), ANIMEGAN_ALLOWED_LICENCES=["own"])
    for args in (["--format", "onnx", "--output", str(tmp_path / "p.onnx")],
                 ["--torchscript", str(tmp_path / "p.ts")]):
        result = app.test_cli_runner().invoke(args=["animegan", "export", "paprika", *args])
        assert result.exit_code == 1
        assert f"its licence {NONCOMMERCIAL} is not among" in result.output
    assert not list(tmp_path.glob("p.*"))


@pytest.mark.parametrize("raw,value", [('["MIT", "own"]', ["MIT", "own"]),
                                       ("MIT, own", ["MIT", "own"]), ("", None),
                                       ('["LicenseRef-AnimeGANv2-NonCommercial"]',
                                        [NONCOMMERCIAL])])
def test_the_environment_gives_a_json_array_or_a_list(raw: str, value: object) -> None:
    assert from_environ({"ANIMEGAN_ALLOWED_LICENCES": raw})["ANIMEGAN_ALLOWED_LICENCES"] == value


def test_extra_styles_need_a_licence_identifier(make_app: Callable[..., Flask]) -> None:
    entry = {"url": "https://x/mine.pt", "sha1": "0" * 40}
    with pytest.raises(RuntimeError, match="'CC BY 4.0' is not a licence identifier"):
        make_app(ANIMEGAN_EXTRA_STYLES={"mine": {**entry, "licence": "CC BY 4.0"}})
    styles = names(make_app(ANIMEGAN_EXTRA_STYLES={"mine": entry, "cc": {
        **entry, "licence": "CC-BY-4.0", "licence_note": "Jane Doe, 2026"}}))
    assert styles["mine"]["licence"] == "NOASSERTION" and styles["mine"]["licence_url"] is None
    assert styles["cc"]["licence_url"] == "https://spdx.org/licenses/CC-BY-4.0.html"
    assert styles["cc"]["licence_note"] == "Jane Doe, 2026"
