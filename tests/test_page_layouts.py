"""The page in Chromium in two layouts (the built-in one, and a Bootstrap 5 site's whose
layout reads a ``title`` variable, as the Flask Mega-Tutorial's does) at a desktop's and a
phone's size: the title, the hints for the pointer, one large before/after view, nothing
wider than the screen, and a screenshot of each in artifacts/screenshots/.

Bootstrap's CSS comes from npm's registry (``npm pack bootstrap@5``, 1.7 MB, once per run),
as a site would have it; without npm the test skips locally and fails in CI.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need
from flask import Flask
from test_browser import (  # noqa: F401  (browser: a fixture)
    CHROMEDRIVER,
    CHROMIUM,
    astronaut_file,
    browser,
    by_id,
    choose_size,
    natural_size,
    save_screenshot,
    wait_for,
)
from test_host_site import ThreadedServer

from flask_animegan import AnimeGAN

pytestmark = pytest.mark.browser

BOOTSTRAP_LAYOUT = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{% if title %}{{ title }} - Microblog{% else %}Welcome to Microblog{% endif %}</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="{{ url_for('static', filename='bootstrap.min.css') }}">
</head>
<body>
  <nav class="navbar navbar-expand-lg bg-body-tertiary">
    <div class="container">
      <a class="navbar-brand" href="/">Microblog</a>
      <ul class="navbar-nav me-auto"><li class="nav-item"><a class="nav-link" href="/">Home</a></li>
        <li class="nav-item"><a class="nav-link" href="{{ url_for('animegan.index') }}">Anime</a></li></ul>
    </div>
  </nav>
  <div class="container mt-3">{% block content %}{% endblock %}</div>
</body>
</html>
"""
#: (name, width, height): a desktop window and a phone (Chromium's headless window is at
#: least 500 px wide, so the phone is emulated, with touch: a coarse pointer).
SIZES = [("desktop", 1280, 900), ("phone", 390, 844)]


def bootstrap_css(folder: Path) -> Path:
    npm = shutil.which("npm")
    need(npm is not None, "npm is not installed (apt-get install npm): it fetches Bootstrap")
    done = subprocess.run([npm, "pack", "bootstrap@5", "--silent", "--pack-destination",
                           str(folder)], capture_output=True, text=True, timeout=120,
                          check=False)
    need(done.returncode == 0, f"npm pack bootstrap@5 failed: {done.stderr[-500:]}")
    (tarball,) = folder.glob("bootstrap-*.tgz")
    with tarfile.open(tarball) as archive:
        css = archive.extractfile("package/dist/css/bootstrap.min.css")
        assert css is not None
        path = folder / "bootstrap.min.css"
        path.write_bytes(css.read())
    return path


def make_site(folder: Path, layout: str) -> Flask:
    """The shipped toon_demo in the built-in layout, or in the Bootstrap site's."""
    (folder / "models").mkdir()
    config = {"SECRET_KEY": "layouts", "ANIMEGAN_MODELS_DIR": str(folder / "models"),
              "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_RATE_LIMIT": "",
              "ANIMEGAN_MAX_SIDE": 512, "ANIMEGAN_WARMUP_SIZE": 64}
    if layout == "built-in":
        app = Flask(__name__)
    else:
        (folder / "templates").mkdir()
        (folder / "templates" / "base.html").write_text(BOOTSTRAP_LAYOUT)
        (folder / "static").mkdir()
        shutil.copy(bootstrap_css(folder), folder / "static")
        app = Flask(__name__, template_folder=str(folder / "templates"),
                    static_folder=str(folder / "static"))
        config |= {"ANIMEGAN_BASE_TEMPLATE": "base.html", "ANIMEGAN_CONTENT_BLOCK": "content"}
    app.config.update(config)
    AnimeGAN(app)
    AnimeGAN.warm_up(app)
    return app


@pytest.fixture(scope="module", params=["built-in", "bootstrap"])
def site(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ThreadedServer]]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    served = ThreadedServer(make_site(tmp_path_factory.mktemp(request.param), request.param))
    yield request.param, served
    served.stop()


@pytest.mark.parametrize(("size", "width", "height"), SIZES, ids=[s[0] for s in SIZES])
def test_the_page_in_a_layout_at_a_size(site, browser, astronaut_file, size, width,  # noqa: F811
                                        height):
    layout, served = site
    phone = size == "phone"
    driver = browser(width=max(width, 500), height=height)
    if phone:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 2, "mobile": True})
        driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled",
                               {"enabled": True, "maxTouchPoints": 5})
    driver.get(f"{served.url}/animegan/")
    assert driver.title == ("Photo to anime - Microblog" if layout == "bootstrap"
                            else "Photo to anime")
    if layout == "bootstrap":  # the site's CSS applies around our page
        navbar = driver.find_element("css selector", ".navbar")
        assert navbar.is_displayed() and navbar.value_of_css_property("display") == "flex"
    coarse = driver.execute_script("return matchMedia('(pointer: coarse)').matches")
    assert coarse == phone
    hint = by_id(driver, "animegan-image-hint").text
    assert ("Ctrl+V" in hint) != phone and ("Tap Photo" in hint) == phone, hint

    by_id(driver, "animegan-image").send_keys(str(astronaut_file))
    choose_size(driver, 384)
    submit = by_id(driver, "animegan-submit")
    # a script's click: under the phone's emulated metrics WebDriver's pointer misses
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); "
                          "arguments[0].click()", submit)
    wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed(), what="the result")
    result = by_id(driver, "animegan-result")
    wait_for(lambda: natural_size(driver, result) == (384, 384), 10, "the result image")
    # one view: the result at its own pixel size at most (never stretched, so never soft),
    # narrower only where the column is, with the photo over it and the slider below; the
    # plain page's "photo you sent" is folded away
    frame = driver.find_element("css selector", ".animegan-compare-frame")
    column = driver.execute_script(
        "return document.querySelector('.animegan').getBoundingClientRect().width")
    assert min(384, column - 40) <= frame.size["width"] <= 384, (frame.size, column)
    assert driver.find_element("css selector", ".animegan-compare-before").is_displayed()
    assert driver.find_element("css selector", ".animegan-compare-range").is_displayed()
    assert not driver.find_element("css selector", ".animegan-photo-sent").is_displayed()
    assert driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    ) <= 0
    assert by_id(driver, "animegan-status").text.startswith("Done in ")
    # Bootstrap scrolls smoothly: a screenshot right after a scroll would catch it halfway
    driver.execute_script("document.documentElement.style.scrollBehavior = 'auto'")
    save_screenshot(driver, f"layout-{layout}-{size}.png",
                    top=by_id(driver, "animegan-result-title"))
    if not phone:
        driver.execute_script("window.scrollTo(0, 0)")
        save_screenshot(driver, f"layout-{layout}-{size}-form.png")
