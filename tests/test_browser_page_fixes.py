"""The page's details in Chromium: an error comes into view with the focus on it; the
before/after slider shows the photo as the result shows it in every mode; the title keeps
the site's name; the result says how long it is kept; the administrator's box names the
command that runs the site. Screenshots: ``SCREENSHOTS_DIR`` (artifacts/screenshots/)."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import click
import numpy as np
import pytest
from conftest import encode_image, need, open_image, photo
from faces_corpus import corpus
from flask import Flask
from PIL import Image
from test_browser import (  # noqa: F401  (browser: a fixture)
    CHROMEDRIVER,
    CHROMIUM,
    browser,
    by_id,
    natural_size,
    save_screenshot,
    shipped_toon_demo,
    wait_for,
)
from test_host_site import ThreadedServer

from flask_animegan import AnimeGAN
from flask_animegan.inputs.decoding import fit

pytestmark = pytest.mark.browser

#: A layout like FlaskBB's: its title block holds the whole title and reads ``page_title``.
FORUM_LAYOUT = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{% block title %}{%- if not page_title -%}Studio Forum - a place to talk
    {%- else -%}{{ page_title }} - Studio Forum{%- endif -%}{% endblock %}</title>
  <link rel="icon" href="data:,">
</head>
<body>
  <header style="background:#234;color:#fff;padding:1rem 2rem">Studio Forum</header>
  <div style="padding:0 2rem">{% block content %}{% endblock %}</div>
</body>
</html>
"""


def make_site(folder: Path, **config: object) -> Flask:
    """toon_demo (the default) and a face style, in the forum's layout, made under a Flask
    CLI named ``studio`` (as ``studio run`` would make it)."""
    models = folder / "models"
    models.mkdir()
    shutil.copy(shipped_toon_demo(), models)
    shutil.copy(models / "toon_demo.pt", models / "face_paint_512_v2.pt")
    (folder / "templates").mkdir()
    (folder / "templates" / "forum.html").write_text(FORUM_LAYOUT)
    app = Flask("studio_site", template_folder=str(folder / "templates"))
    app.config.update({
        "SECRET_KEY": "page fixes", "ANIMEGAN_MODELS_DIR": str(models),
        "ANIMEGAN_DEFAULT_STYLE": "toon_demo", "ANIMEGAN_PRECISION": "fp32",
        "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_MAX_SIDE": 512, "ANIMEGAN_WARMUP_SIZE": 64,
        "ANIMEGAN_SAMPLE_SIZE": 0, "ANIMEGAN_RESULT_TTL": 600,
        "ANIMEGAN_BASE_TEMPLATE": "forum.html", "ANIMEGAN_CONTENT_BLOCK": "content",
        "ANIMEGAN_ADMIN_CHECK": lambda: True, **config})
    with click.Context(click.Group("studio"), info_name="studio"):
        AnimeGAN(app)
    AnimeGAN.warm_up(app)
    return app


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    served = ThreadedServer(make_site(tmp_path_factory.mktemp("page-fixes")))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def limited_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    served = ThreadedServer(make_site(tmp_path_factory.mktemp("page-fixes-limited"),
                                      ANIMEGAN_RATE_LIMIT="1 per minute"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("page-fixes-photos")
    files = {"coffee": photo("coffee"),  # 600 x 400, no face
             "group": corpus(5)[4].image}  # 1280 x 960, five faces
    paths = {}
    for name, image in files.items():
        paths[name] = folder / f"{name}.jpg"
        paths[name].write_bytes(encode_image(image, quality=92))
    paths["notes"] = folder / "notes.jpg"
    paths["notes"].write_text("not a photo\n")
    return paths


def submit(driver, url: str, path: Path, **options: str) -> None:
    """The page, the file and the options chosen, then Convert pressed from below."""
    from selenium.webdriver.support.select import Select

    driver.get(f"{url}/animegan/")
    by_id(driver, "animegan-image").send_keys(str(path))
    for name, value in options.items():
        if name == "style":
            driver.find_element("css selector", f"input[name=style][value={value}]").click()
        else:
            Select(by_id(driver, f"animegan-{name}")).select_by_value(value)
    button = by_id(driver, "animegan-submit")
    # scrolled as a visitor has it when pressing Convert: the button at the window's bottom
    driver.execute_script("document.documentElement.style.scrollBehavior = 'auto';"
                          "arguments[0].scrollIntoView({block: 'end'});"
                          "window.scrollBy(0, 200)", button)
    button.click()


def error_in_view_and_focused(driver) -> dict[str, float | str]:
    return driver.execute_script("""const box = document.getElementById('animegan-error');
        const r = box.getBoundingClientRect();
        return {top: r.top, bottom: r.bottom, height: innerHeight,
                focused: document.activeElement.id, text: box.textContent};""")


# -- 1. an error comes into view, with the focus -------------------------------------

def test_a_415_error_is_scrolled_into_view_and_focused(site, browser, photos):  # noqa: F811
    driver = browser(height=700)
    submit(driver, site.url, photos["notes"])
    wait_for(lambda: by_id(driver, "animegan-error").is_displayed(), what="the error")
    where = error_in_view_and_focused(driver)
    assert "not an image this server can read" in where["text"]
    assert where["focused"] == "animegan-error"
    assert 16 <= where["top"] and where["bottom"] <= where["height"], where
    assert by_id(driver, "animegan-error").get_attribute("role") == "alert"
    save_screenshot(driver, "page-error-415.png")


def test_without_javascript_the_error_page_puts_the_focus_on_the_error(site, browser,  # noqa: F811
                                                                       photos):
    driver = browser(javascript=False, height=700)
    submit(driver, site.url, photos["notes"])
    wait_for(lambda: by_id(driver, "animegan-error").is_displayed(), what="the error page")
    where = error_in_view_and_focused(driver)
    assert "not an image this server can read" in where["text"]
    assert where["focused"] == "animegan-error" and where["bottom"] <= where["height"], where


def test_a_429_error_is_scrolled_into_view_and_focused(limited_site, browser,  # noqa: F811
                                                       photos):
    driver = browser(height=700)
    text = ""
    for _ in range(2):  # the first converts; the second is over the limit
        submit(driver, limited_site.url, photos["coffee"], size="256")
        wait_for(lambda: by_id(driver, "animegan-error").is_displayed()
                 or by_id(driver, "animegan-result-panel").is_displayed(), what="an answer")
        text = by_id(driver, "animegan-error").text
    assert "too many conversions" in text.lower(), text
    where = error_in_view_and_focused(driver)
    assert where["focused"] == "animegan-error"
    assert 16 <= where["top"] and where["bottom"] <= where["height"], where
    save_screenshot(driver, "page-error-429.png")


# -- 2. the slider compares like with like -------------------------------------------

def shown_photo(driver) -> Image.Image:
    """The before/after view with the slider at 100 (all photo), as drawn on the screen."""
    frame = driver.find_element("css selector", "#animegan-result-panel .animegan-compare-frame")
    driver.execute_script("""const range = arguments[0];
        range.value = 100; range.dispatchEvent(new Event('input'));""",
                          driver.find_element("css selector", "#animegan-result-panel "
                                                              ".animegan-compare-range"))
    driver.execute_script("document.documentElement.style.scrollBehavior = 'auto';"
                          "arguments[0].scrollIntoView({block: 'start'})", frame)
    return Image.open(io.BytesIO(frame.screenshot_as_png)).convert("RGB")


def difference(a: Image.Image, b: Image.Image) -> float:
    """Mean absolute difference of two pictures at a common small size, 0 to 255."""
    size = (96, max(1, round(96 * a.height / a.width)))
    return float(np.abs(np.asarray(a.resize(size), np.float32)
                        - np.asarray(b.resize(size), np.float32)).mean())


@pytest.mark.parametrize(("mode", "source", "options"), [
    ("full-picture", "coffee", {"portrait": "off"}),
    ("face-style-square", "coffee", {"style": "face_paint_512_v2", "portrait": "off"}),
    ("faces-only", "group", {"portrait": "faces"}),
])
def test_the_slider_compares_the_photo_as_the_result_shows_it(site, browser, photos,  # noqa: F811
                                                              mode,
                                                              source, options):
    driver = browser(height=1400)
    submit(driver, site.url, photos[source], size="512", **options)
    result = by_id(driver, "animegan-result")
    wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed()
             and natural_size(driver, result)[0] > 0, what="the result")
    before = driver.find_element("css selector",
                                 "#animegan-result-panel .animegan-compare-before")
    wait_for(before.is_displayed, 30, "the photo under the slider")
    wait_for(lambda: driver.execute_script("return arguments[0].complete", before), 10)
    width, height = natural_size(driver, result)
    original = open_image(photos[source].read_bytes()).convert("RGB")
    if mode == "full-picture":
        expected = fit(original, 512)
    elif mode == "face-style-square":
        expected = fit(original, 512, square=True)
    else:  # the server's own photo beside the same result: the form's result page
        expected = faces_side_by_side(driver, site.url, photos[source])
    assert expected.size[0] * height == expected.size[1] * width, (expected.size, width,
                                                                     height)
    shown = shown_photo(driver)
    driver.execute_script("""const range = arguments[0];
        range.value = 50; range.dispatchEvent(new Event('input'));""",
                          driver.find_element("css selector", "#animegan-result-panel "
                                                              ".animegan-compare-range"))
    save_screenshot(driver, f"page-slider-{mode}.png",
                    top=by_id(driver, "animegan-result-title"))
    stretched = original.resize(expected.size)
    like, unlike = difference(shown, expected), difference(shown, stretched)
    assert like < 12, (like, unlike)
    if mode != "full-picture":  # there the stretched photo is the same picture
        assert like < unlike / 2, (like, unlike)


def faces_side_by_side(driver, url: str, path: Path) -> Image.Image:
    """The photo the form's result page (no JavaScript) shows beside its faces-only result."""
    import requests

    session = requests.Session()
    page = session.get(f"{url}/animegan/").text
    token = page.split('name="csrf_token" value="')[1].split('"')[0]
    with path.open("rb") as file:
        answer = session.post(f"{url}/animegan/upload", files={"image": file},
                              data={"csrf_token": token, "size": "512", "portrait": "faces",
                                    "format": "png"})
    assert answer.status_code == 200, answer.text[-500:]
    src = answer.text.split('animegan-compare-before animegan-original" src="')[1].split('"')[0]
    return open_image(session.get(url + src).content).convert("RGB")


# -- 3, 4, 5: the title, the time kept, the command ---------------------------------

def test_the_title_keeps_the_sites_name_and_the_result_says_how_long_it_is_kept(
        site, browser, photos):  # noqa: F811
    driver = browser(javascript=False, height=1200)
    driver.get(f"{site.url}/animegan/")
    assert driver.title == "Photo to anime - Studio Forum"
    by_id(driver, "animegan-image").send_keys(str(photos["coffee"]))
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: "/animegan/result/" in driver.current_url, what="the result page")
    assert driver.title == "Your anime picture - Studio Forum"
    note = driver.find_element("xpath", "//p[contains(., 'are kept for')]")
    assert note.text == "This page and its pictures are kept for 10 minutes, then they disappear."
    save_screenshot(driver, "page-title-and-kept.png", top=note)


def test_the_administrators_box_names_the_sites_own_command(site, browser):  # noqa: F811
    driver = browser(height=1600)
    driver.get(f"{site.url}/animegan/")
    box = driver.find_element("css selector", ".animegan-admin")
    commands = [code.text for code in box.find_elements("css selector", "code")]
    assert "studio animegan pull paprika" in commands, commands
    assert not any(c.startswith("flask ") for c in commands), commands
    save_screenshot(driver, "page-admin-command.png", top=box)
