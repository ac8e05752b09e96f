"""The strength slider in a real browser (tests/test_browser.py's Chromium and gunicorn):
moving it previews in the page with no request to the convert route, and the preview is
the server's mix, which the download asks for (a cache hit).

Screenshots at 30 % and 70 % are saved as ``strength-slider-30.png`` and ``-70.png``
under ``artifacts/screenshots/`` (``SCREENSHOTS_DIR`` moves them)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from conftest import open_image, photo
from PIL import Image
from test_browser import (  # noqa: F401 - fixtures
    astronaut_file,
    browser,
    by_id,
    choose_size,
    natural_size,
    save_screenshot,
    server,
    wait_for,
    wait_for_download,
)

from flask_animegan.convert.colors import lab_from_rgb
from flask_animegan.inputs.decoding import fit

pytestmark = [pytest.mark.server, pytest.mark.browser]

CONVERT_REQUESTS = """return performance.getEntriesByType('resource')
    .filter(e => new URL(e.name).pathname.endsWith('/convert')).length"""
CANVAS_PIXELS = """const canvas = document.querySelector('#animegan-result-panel .animegan-strength-canvas');
    return canvas.hidden ? null : canvas.toDataURL('image/png')"""


def distance(picture: Image.Image, reference: Image.Image) -> float:
    a, b = (lab_from_rgb(np.asarray(p.convert("RGB"))) for p in (picture, reference))
    return float(np.sqrt(((a - b) ** 2).sum(axis=-1)).mean())


def canvas_at(driver, percent: int) -> Image.Image:
    """Move the slider with the keyboard to ``percent`` and return the preview drawn."""
    from selenium.webdriver.common.keys import Keys

    slider = by_id(driver, "animegan-strength")
    now = int(slider.get_attribute("value"))
    key = Keys.ARROW_LEFT if percent < now else Keys.ARROW_RIGHT
    slider.send_keys(*[key] * abs(percent - now))
    wait_for(lambda: by_id(driver, "animegan-strength").get_attribute("value") == str(percent)
             and driver.find_element("css selector", ".animegan-strength-value").text
             == f"{percent} %", 10, f"the slider at {percent} %")
    url = None

    def drawn() -> bool:  # the newest value drawn: two reads a frame apart agree
        nonlocal url
        first = driver.execute_script(CANVAS_PIXELS)
        driver.execute_script("return new Promise(r => requestAnimationFrame(() => "
                              "requestAnimationFrame(r)))")
        url = driver.execute_script(CANVAS_PIXELS)
        return first is not None and first == url

    wait_for(drawn, 20, "the preview")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")


def test_the_slider_previews_without_a_request_and_the_download_is_the_servers_mix(
        server, browser, astronaut_file):  # noqa: F811
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    by_id(driver, "animegan-image").send_keys(str(astronaut_file))
    choose_size(driver, 256)
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed(), what="the result")
    result = by_id(driver, "animegan-result")
    wait_for(lambda: natural_size(driver, result) == (256, 256), 10, "the result image")
    assert driver.execute_script(CONVERT_REQUESTS) == 1
    assert by_id(driver, "animegan-strength").get_attribute("value") == "100"
    # the before/after slider to the far left: the whole view is the (previewed) result
    driver.execute_script("""const range = arguments[0];
        range.value = 0; range.dispatchEvent(new Event('input'));""",
                          driver.find_element("css selector",
                                              "#animegan-result-panel .animegan-compare-range"))

    fitted = fit(photo("astronaut"), 256)
    previews = {}
    for percent in (30, 70, 0, 100):
        previews[percent] = canvas_at(driver, percent)
        if percent in (30, 70):
            save_screenshot(driver, f"strength-slider-{percent}.png",
                            top=by_id(driver, "animegan-result-title"))
    # moving it asked the server for nothing
    assert driver.execute_script(CONVERT_REQUESTS) == 1
    far = {p: distance(picture, fitted) for p, picture in previews.items()}
    assert far[0] < 2.0 < far[30] < far[70] < far[100], far  # 0: the photo, JPEG's loss aside

    canvas_at(driver, 70)
    by_id(driver, "animegan-download").click()
    saved = wait_for_download(driver.downloads, "astronaut-toon_demo-70.jpg")
    assert driver.execute_script(CONVERT_REQUESTS) == 2  # the download: one cache hit
    served = open_image(saved.read_bytes()).convert("RGB")
    assert served.size == (256, 256)
    # the page's preview is the server's mix, give or take JPEG and the blur's edges
    assert distance(served, previews[70]) < 3.0, distance(served, previews[70])
    assert "70 %" in by_id(driver, "animegan-status").text


def test_the_result_page_slider_with_and_without_javascript(server, browser,  # noqa: F811
                                                            astronaut_file):
    from selenium.webdriver.common.keys import Keys

    plain = browser(javascript=False)
    plain.get(f"{server.url}/animegan/")
    by_id(plain, "animegan-image").send_keys(str(astronaut_file))
    choose_size(plain, 256)
    by_id(plain, "animegan-submit").click()
    wait_for(lambda: "/animegan/result/" in plain.current_url, what="the result page")
    page = plain.current_url
    # without JavaScript the slider is a form: Apply reloads the page at that strength
    by_id(plain, "animegan-strength").send_keys(*[Keys.ARROW_LEFT] * 60)
    plain.find_element("css selector", ".animegan-strength button").click()
    wait_for(lambda: plain.current_url.endswith("?strength=40"), 10, "the page at 40 %")
    result = by_id(plain, "animegan-result")
    assert result.get_attribute("src").endswith("/anime?strength=40")
    assert by_id(plain, "animegan-download").get_attribute("href").endswith(
        "/anime?download=1&strength=40")
    assert plain.find_element("css selector", ".animegan-strength-value").text == "40 %"

    # with JavaScript the same page previews in place and its download follows the slider
    driver = browser()
    driver.get(page)
    assert not driver.find_element("css selector", ".animegan-strength button").is_displayed()
    slider = by_id(driver, "animegan-strength")
    slider.send_keys(*[Keys.ARROW_LEFT] * 20)
    wait_for(lambda: by_id(driver, "animegan-download").get_attribute("href").endswith(
        "/anime?download=1&strength=80"), 10, "the download at 80 %")
    wait_for(lambda: driver.execute_script(
        "return !document.querySelector('.animegan-strength-canvas').hidden"), 20,
        "the preview")
    assert driver.current_url == page  # no reload
    assert driver.execute_script(CONVERT_REQUESTS) == 0
