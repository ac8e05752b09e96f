"""Themed layouts: a forum that renders its layout through the real Flask-Themes2
(tests/theme_site, theme ``lagoon``) shows the form, the result of a photo converted through
the form, the job page of an animation and the error pages inside its theme, with the
theme's stylesheet served; ANIMEGAN_RENDER_TEMPLATE is resolved once at start, and a bad one
stops the app. In Chromium (marker ``browser``): the themed page converts a photo, with
screenshots.
"""

from __future__ import annotations

import io
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TEST_CONFIG, need, open_image, photo_bytes
from flask import Flask
from flask.testing import FlaskClient
from media import gif_from_photos

# the browser fixtures, shared with the upload page's own browser tests
from test_browser import (  # noqa: F401
    CHROMEDRIVER,
    CHROMIUM,
    astronaut_file,
    browser,
    by_id,
    choose_size,
    natural_size,
    save_screenshot,
    shipped_toon_demo,
    wait_for,
)
from test_host_site import ThreadedServer
from theme_site import create_app, render_in_theme

from flask_animegan.config import from_environ
from flask_animegan.web.views import PageNotRendered

HEADER = '<header class="lagoon-header" id="lagoon-header">'
STYLESHEET = '<link rel="stylesheet" href="/_themes/lagoon/style.css">'
OUR_FORM = re.compile(r'<form id="animegan-form".*?name="csrf_token" value="([^"]+)"', re.DOTALL)
JOB_DEADLINE = 120  # seconds: six small frames on a busy 2-core machine


@pytest.fixture(scope="module")
def forum(models_dir: Path) -> Callable[..., Flask]:
    """create_app with the suite's fast settings (the test styles, small images, no limit)."""

    def make(**config: object) -> Flask:
        fast = {key: value for key, value in TEST_CONFIG.items()
                if key.startswith("ANIMEGAN_") and key != "ANIMEGAN_CSRF"}
        return create_app(models_dir, **{**fast, **config})

    return make


@pytest.fixture(scope="module")
def themed(forum: Callable[..., Flask]) -> Flask:
    return forum()


def in_theme(html: str) -> None:
    """The page sits in the theme's layout: its header, its stylesheet, its name."""
    assert HEADER in html and STYLESHEET in html, html[:600]
    assert "theme: Lagoon" in html and "· Lagoon Forum</title>" in html


def form_token(client: FlaskClient) -> str:
    page = client.get("/anime/")
    assert page.status_code == 200
    found = OUR_FORM.search(page.get_data(as_text=True))
    assert found, "the upload form carries no csrf_token"
    return found.group(1)


def test_the_form_renders_in_the_theme_and_its_stylesheet_is_served(themed):
    client = themed.test_client()
    page = client.get("/anime/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    in_theme(html)
    assert '<form id="animegan-form"' in html  # our form, in the theme's <main>
    assert html.index('<main class="lagoon-main">') < html.index('<form id="animegan-form"')
    with client.get("/_themes/lagoon/style.css") as css:  # a file: closed after reading
        assert css.status_code == 200 and css.mimetype == "text/css"
        assert b".lagoon-header" in css.data
    # the site's own page, for comparison: the same layout
    in_theme(client.get("/").get_data(as_text=True))


def test_a_photo_converted_through_the_form_shows_its_result_in_the_theme(themed):
    client = themed.test_client()
    form = {"image": (io.BytesIO(photo_bytes("astronaut")), "astronaut.jpg"), "size": "64",
            "csrf_token": form_token(client)}
    sent = client.post("/anime/upload", data=form, content_type="multipart/form-data")
    assert sent.status_code == 303, sent.get_data(as_text=True)[:500]
    result_url = sent.headers["Location"]
    page = client.get(result_url)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    in_theme(html)
    found = re.search(r'<img id="animegan-result"[^>]* src="([^"]+)"', html)
    assert found, html
    picture = client.get(found.group(1))
    assert picture.status_code == 200 and picture.mimetype == "image/jpeg"
    assert open_image(picture.data).size == (64, 64)  # the astronaut is square


def test_an_animation_becomes_a_job_whose_page_is_in_the_theme(themed):
    client = themed.test_client()
    form = {"image": (io.BytesIO(gif_from_photos(6)), "cat.gif", "image/gif"), "size": "32",
            "csrf_token": form_token(client)}
    sent = client.post("/anime/upload", data=form, content_type="multipart/form-data")
    assert sent.status_code == 303, sent.get_data(as_text=True)[:500]
    page_url = sent.headers["Location"]
    assert re.fullmatch(r"/anime/jobs/[A-Za-z0-9_-]{32}/page", page_url)
    in_theme(client.get(page_url).get_data(as_text=True))  # while it waits or runs
    deadline = time.monotonic() + JOB_DEADLINE
    while (state := client.get(page_url.removesuffix("/page")).get_json()["state"]) not in (
            "done", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"the job is still {state}"
        time.sleep(0.05)
    assert state == "done"
    html = client.get(page_url).get_data(as_text=True)
    in_theme(html)
    assert "Your anime animation" in html and "Download" in html


def test_the_error_pages_are_in_the_theme(themed):
    client = themed.test_client()
    gone = client.get(f"/anime/result/{'A' * 32}")
    assert gone.status_code == 404
    html = gone.get_data(as_text=True)
    in_theme(html)
    assert "This result has expired or never existed" in html
    refused = client.post("/anime/upload", data={"size": "64"},
                          content_type="multipart/form-data")  # no token
    assert refused.status_code == 400
    in_theme(refused.get_data(as_text=True))


def test_the_renderer_may_be_named_by_its_dotted_path(forum):
    for path in ("theme_site:render_in_theme", "theme_site.render_in_theme"):
        app = forum(ANIMEGAN_RENDER_TEMPLATE=path)
        assert app.extensions["animegan"].render_template is render_in_theme
        in_theme(app.test_client().get("/anime/").get_data(as_text=True))


@pytest.mark.parametrize(("path", "words"), [
    ("theme_site:no_such_renderer", "cannot be imported"),
    ("no_such_site.themes:render", "cannot be imported"),
    ("theme_site.THEME", "is a str, not a callable"),
    ("render_in_theme", "neither a callable nor the dotted path of one"),
])
def test_a_renderer_that_cannot_be_used_stops_the_app_naming_the_setting(forum, path, words):
    with pytest.raises(RuntimeError, match="ANIMEGAN_RENDER_TEMPLATE") as error:
        forum(ANIMEGAN_RENDER_TEMPLATE=path)
    assert words in str(error.value) and path in str(error.value)


def test_without_the_renderer_a_themed_layout_fails_clearly(forum, caplog):
    """Flask's render_template sets no active theme, so the layout's theme() cannot run:
    the failure names the setting to set, and the visitor gets the error page in the
    built-in layout."""
    testing = forum(ANIMEGAN_RENDER_TEMPLATE="flask.render_template", TESTING=True)
    with pytest.raises(PageNotRendered, match="set ANIMEGAN_RENDER_TEMPLATE") as error:
        testing.test_client().get("/anime/")  # TESTING: the exception reaches the test
    assert "Could not find the active theme" in str(error.value)
    assert "ANIMEGAN_BASE_TEMPLATE='themed_layout.html'" in str(error.value)

    served = forum(ANIMEGAN_RENDER_TEMPLATE="flask.render_template")
    with caplog.at_level(logging.ERROR):
        page = served.test_client().get("/anime/")
    assert page.status_code == 500
    html = page.get_data(as_text=True)
    assert '<body class="animegan-page">' in html and HEADER not in html  # the built-in layout
    assert any("set ANIMEGAN_RENDER_TEMPLATE" in record.getMessage()
               or "set ANIMEGAN_RENDER_TEMPLATE" in str(record.exc_info and record.exc_info[1])
               for record in caplog.records)


def test_a_plain_layout_keeps_working_with_the_default(forum, app):
    """Flask-Themes2 on the app, a layout without theme calls: Flask's renderer is enough;
    and a site without any theme manager renders as before."""
    plain = forum(ANIMEGAN_RENDER_TEMPLATE="flask.render_template",
                  ANIMEGAN_BASE_TEMPLATE="animegan/base.html",
                  ANIMEGAN_CONTENT_BLOCK="animegan_content")
    page = plain.test_client().get("/anime/")
    assert page.status_code == 200 and '<form id="animegan-form"' in page.get_data(as_text=True)
    page = app.test_client().get("/animegan/")
    assert page.status_code == 200 and '<form id="animegan-form"' in page.get_data(as_text=True)


def test_from_the_environment_a_dotted_path_or_empty_for_flask_s_own():
    assert from_environ({"ANIMEGAN_RENDER_TEMPLATE": "theme_site:render_in_theme"}) == {
        "ANIMEGAN_RENDER_TEMPLATE": "theme_site:render_in_theme"}
    assert from_environ({"ANIMEGAN_RENDER_TEMPLATE": " "}) == {
        "ANIMEGAN_RENDER_TEMPLATE": "flask.render_template"}

# -- in Chromium -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served_forum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The forum with the shipped toon_demo, on werkzeug's threaded server in this process."""
    need(CHROMIUM is not None and CHROMEDRIVER is not None,
         "the browser tests need Debian's chromium and chromium-driver")
    models = tmp_path_factory.mktemp("forum-models")
    shutil.copy(shipped_toon_demo(), models)
    app = create_app(models, ANIMEGAN_DEFAULT_STYLE="toon_demo", ANIMEGAN_PRECISION="fp32",
                     ANIMEGAN_BACKEND="torch", ANIMEGAN_MAX_SIDE=512, ANIMEGAN_RATE_LIMIT="",
                     ANIMEGAN_WARMUP_SIZE=64)
    server = ThreadedServer(app)
    yield server.url
    server.stop()


def themed_header(driver) -> None:
    """The theme's header is there, painted by the theme's stylesheet (its teal bar)."""
    header = by_id(driver, "lagoon-header")
    assert header.is_displayed()
    assert header.value_of_css_property("background-color") == "rgba(0, 109, 119, 1)"


@pytest.mark.browser
@pytest.mark.parametrize("javascript", [True, False], ids=["script", "no-script"])
def test_in_chromium_the_themed_page_converts_a_photo(served_forum, browser, astronaut_file,  # noqa: F811
                                                      javascript, tmp_path):
    """With the script, the result shows on the form's page; without, on the result page.
    Screenshots in artifacts/screenshots/ (SCREENSHOTS_DIR) and the test's tmp folder."""
    driver = browser(javascript=javascript, height=2100)  # the whole page in one shot
    kind = "script" if javascript else "no-script"
    driver.get(f"{served_forum}/anime/")
    assert driver.title.endswith("· Lagoon Forum")
    themed_header(driver)
    shots = [save_screenshot(driver, f"themes-form-{kind}.png")] if javascript else []
    by_id(driver, "animegan-image").send_keys(str(astronaut_file))
    choose_size(driver, 384)
    by_id(driver, "animegan-submit").click()
    if javascript:
        wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed(),
                 what="the result")
        assert by_id(driver, "animegan-status").text.startswith("Done in ")
    else:
        wait_for(lambda: "/anime/result/" in driver.current_url, what="the result page")
    result = by_id(driver, "animegan-result")
    wait_for(lambda: natural_size(driver, result) == (384, 384), 10, "the result image")
    themed_header(driver)  # still in the theme
    driver.execute_script("window.scrollTo(0, 0)")
    shots.append(save_screenshot(driver, f"themes-result-{kind}.png"))
    for shot in shots:
        shutil.copy(shot, tmp_path / shot.name)
        print(f"screenshot: {shot}")

