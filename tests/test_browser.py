"""The upload page in a real browser: Debian's headless Chromium, driven by Selenium through
the system chromedriver, against the real gunicorn serving the example app with the shipped
``toon_demo`` style.

Screenshots of the result pages (a real photo, really converted) are saved under
``artifacts/screenshots/`` (``SCREENSHOTS_DIR`` moves them).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO, encode_image, need, open_image, photo
from servers import Server

pytestmark = [pytest.mark.server, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
SCREENSHOTS = Path(os.environ.get("SCREENSHOTS_DIR", REPO / "artifacts" / "screenshots"))
WAIT = 90  # seconds: a conversion on a busy 2-core machine


def shipped_toon_demo() -> Path:
    """The shipped style's weights (package data, or the repository's models folder)."""
    for path in (REPO / "flask_animegan" / "shipped_styles" / "toon_demo.pt",
                 REPO / "models" / "toon_demo.pt"):
        if path.exists():
            return path
    raise FileNotFoundError("toon_demo.pt is neither package data nor in models/")


def start_server(tmp: Path, models_dir: Path, **env: str) -> Server:
    """gunicorn with the example app; styles: the shipped toon_demo (default) and test_style."""
    models = tmp / "models"
    models.mkdir()
    shutil.copy(shipped_toon_demo(), models)
    shutil.copy(models_dir / "test_style.pt", models)
    return Server({
        "ANIMEGAN_MODELS_DIR": str(models), "ANIMEGAN_DEFAULT_STYLE": "toon_demo",
        "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_RATE_LIMIT": "",
        "ANIMEGAN_MAX_SIDE": "512", **env,
    }, log=tmp / "gunicorn.log")


@pytest.fixture(scope="module")
def server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None,
         "the browser tests need Debian's chromium and chromium-driver "
         "(apt-get install chromium chromium-driver)")
    instance = start_server(tmp_path_factory.mktemp("browser-server"), models_dir)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def limited_server(models_dir: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    instance = start_server(tmp_path_factory.mktemp("limited-server"), models_dir,
                            ANIMEGAN_RATE_LIMIT="1 per minute", ANIMEGAN_MAX_SIDE="128")
    yield instance
    instance.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """A factory of headless Chromium sessions: browser(javascript=True, width=1280, height=1400)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager download
    drivers = []

    def start(javascript: bool = True, width: int = 1280, height: int = 1400):
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--no-first-run", f"--window-size={width},{height}"):
            options.add_argument(flag)
        downloads = tmp_path / f"downloads-{len(drivers)}"
        downloads.mkdir()
        # the console, for the tests that read it (driver.get_log("browser"))
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        options.add_experimental_option("prefs", {
            "download.default_directory": str(downloads),
            "download.prompt_for_download": False,
            "profile.managed_default_content_settings.javascript": 1 if javascript else 2,
        })
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                               {"behavior": "allow", "downloadPath": str(downloads)})
        driver.downloads = downloads
        drivers.append(driver)
        return driver

    yield start
    for driver in drivers:
        driver.quit()


@pytest.fixture(scope="module")
def astronaut_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real photo (512x512) with a name, as a person would pick it from their disk."""
    path = tmp_path_factory.mktemp("photos") / "astronaut.jpg"
    path.write_bytes(encode_image(photo("astronaut"), quality=92))
    return path


@pytest.fixture(scope="module")
def coffee_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photos") / "coffee.jpg"  # 600x400
    path.write_bytes(encode_image(photo("coffee"), quality=92))
    return path


@pytest.fixture(scope="module")
def not_a_photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("photos") / "holiday.jpg"
    path.write_text("These are my notes, not a photo.\n")
    return path


def wait_for(condition: Callable[[], object], timeout: float = WAIT, what: str = "") -> object:
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None  # the next page is still loading
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")


def wait_for_download(folder: Path, name: str | None = None) -> Path:
    def done() -> Path | None:
        # Chromium reserves the final name (empty) while it writes the .crdownload beside it
        found = list(folder.iterdir())
        if any(p.name.endswith(".crdownload") for p in found):
            return None
        files = [p for p in found if p.stat().st_size > 0]
        if name is not None:
            files = [p for p in files if p.name == name]
        return files[0] if files else None

    return wait_for(done, 30, f"a download in {folder}")


def save_screenshot(driver, name: str, top=None) -> Path:
    """Save the viewport, scrolled so that element ``top`` is at its top."""
    if top is not None:
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", top)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    driver.save_screenshot(str(path))
    return path


def by_id(driver, element_id: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def choose_size(driver, size: int) -> None:
    from selenium.webdriver.support.select import Select

    Select(by_id(driver, "animegan-size")).select_by_value(str(size))


def natural_size(driver, element) -> tuple[int, int]:
    return tuple(driver.execute_script(
        "return [arguments[0].naturalWidth, arguments[0].naturalHeight]", element))


# -- without JavaScript: the plain form ------------------------------------------------

def test_without_javascript_the_form_posts_and_shows_the_result_page(server, browser,
                                                                     coffee_file, not_a_photo):
    driver = browser(javascript=False)
    driver.get(f"{server.url}/animegan/")
    # the script did not run: its extras stay hidden, the form is the plain one
    assert "animegan-js" not in (driver.find_element("tag name", "html").get_attribute("class")
                                 or "")
    assert not driver.find_element("css selector", ".animegan-js-only").is_displayed()

    by_id(driver, "animegan-image").send_keys(str(coffee_file))
    choose_size(driver, 384)
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: "/animegan/result/" in driver.current_url, what="the result page")

    result = by_id(driver, "animegan-result")
    assert result.is_displayed() and result.size["width"] > 100
    assert natural_size(driver, result) == (384, 256)  # coffee is 600x400
    # one view: the result; the photo sent is folded away under it, and opens
    assert not driver.find_element("css selector", ".animegan-compare-before").is_displayed()
    assert not driver.find_element("css selector", ".animegan-compare-range").is_displayed()
    driver.find_element("css selector", ".animegan-photo-sent summary").click()
    original = driver.find_element("css selector", ".animegan-photo-sent .animegan-original")
    assert original.is_displayed() and natural_size(driver, original) == (384, 256)
    save_screenshot(driver, "result-no-js.png")

    by_id(driver, "animegan-download").click()
    downloaded = wait_for_download(driver.downloads)
    assert downloaded.name == "anime-toon_demo.jpg"
    image = open_image(downloaded.read_bytes())
    assert image.format == "JPEG" and image.size == (384, 256)

    # a file that is not a photo: the page comes back with the reason
    driver.get(f"{server.url}/animegan/")
    by_id(driver, "animegan-image").send_keys(str(not_a_photo))
    by_id(driver, "animegan-submit").click()
    error = wait_for(lambda: by_id(driver, "animegan-error").is_displayed()
                     and by_id(driver, "animegan-error"), what="the error")
    assert "not an image this server can read" in error.text


# -- with JavaScript: the enhanced page ----------------------------------------------

RECORD_STATUS = """
window.statuses = [];
new MutationObserver(() => window.statuses.push(
    document.getElementById('animegan-status').textContent)).observe(
    document.getElementById('animegan-status'), {childList: true, characterData: true,
                                                 subtree: true});
"""


def test_with_javascript_preview_convert_compare_and_download(server, browser,
                                                              astronaut_file):
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    assert "animegan-js" in driver.find_element("tag name", "html").get_attribute("class")
    # every installed style shows its sample, made by the server at startup
    samples = driver.find_elements("css selector", ".animegan-style-card img")
    assert len(samples) == 2
    for sample in samples:
        wait_for(lambda s=sample: natural_size(driver, s)[0] == 128, 30, "the style samples")

    by_id(driver, "animegan-image").send_keys(str(astronaut_file))
    preview = by_id(driver, "animegan-preview")
    wait_for(lambda: preview.is_displayed() and natural_size(driver, preview)[0] == 512,
             10, "the preview")
    choose_size(driver, 256)
    driver.execute_script(RECORD_STATUS)
    by_id(driver, "animegan-submit").click()
    panel = wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed()
                     and by_id(driver, "animegan-result-panel"), what="the result")
    result = by_id(driver, "animegan-result")
    wait_for(lambda: natural_size(driver, result) == (256, 256), 10, "the result image")
    assert driver.current_url.endswith("/animegan/")  # no page load
    statuses = driver.execute_script("return window.statuses")
    assert any(s.startswith("Converting") for s in statuses), statuses  # the busy indicator
    assert by_id(driver, "animegan-status").text.startswith("Done in ")
    assert "cache" not in by_id(driver, "animegan-status").text
    assert by_id(driver, "animegan-submit").is_enabled()

    # one before/after view, drawn at the result's own pixel size (never stretched)
    assert len(panel.find_elements("css selector", "figure")) == 1
    assert panel.find_element("css selector", ".animegan-compare-frame").size["width"] == 256
    assert not panel.find_element("css selector", ".animegan-photo-sent").is_displayed()
    assert panel.find_element("css selector", ".animegan-caption").text == "toon_demo, 256×256"

    # the before/after slider uncovers the photo from the left
    compare = panel.find_element("css selector", "[data-animegan-compare]")
    assert compare.is_displayed()
    driver.execute_script("""const range = arguments[0];
        range.value = 30; range.dispatchEvent(new Event('input'));""",
                          compare.find_element("css selector", "input[type=range]"))
    before = compare.find_element("css selector", ".animegan-compare-before")
    assert "70%" in driver.execute_script("return arguments[0].style.clipPath", before)
    save_screenshot(driver, "result-js.png", top=by_id(driver, "animegan-result-title"))

    download = by_id(driver, "animegan-download")
    assert download.get_attribute("download") == "astronaut-toon_demo.jpg"
    assert download.get_attribute("href").startswith("blob:")
    download.click()
    image = open_image(wait_for_download(driver.downloads, "astronaut-toon_demo.jpg")
                       .read_bytes())
    assert image.format == "JPEG" and image.size == (256, 256)

    # the same photo again: answered from the cache, and the status says so
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: "from the cache" in by_id(driver, "animegan-status").text, 30,
             "the status of a cached result")
    assert by_id(driver, "animegan-status").text.startswith("Done in ")


DROP_OR_PASTE = """
const [kind, done] = [arguments[0], arguments[arguments.length - 1]];
fetch(arguments[1]).then(r => r.blob()).then(blob => {
  const transfer = new DataTransfer();
  transfer.items.add(new File([blob], 'dropped.jpg', {type: 'image/jpeg'}));
  if (kind === 'drop') {
    const zone = document.getElementById('animegan-drop');
    zone.dispatchEvent(new DragEvent('dragover', {dataTransfer: transfer, bubbles: true,
                                                  cancelable: true}));
    zone.dispatchEvent(new DragEvent('drop', {dataTransfer: transfer, bubbles: true,
                                              cancelable: true}));
  } else {
    document.dispatchEvent(new ClipboardEvent('paste', {clipboardData: transfer,
                                                        bubbles: true, cancelable: true}));
  }
  done(document.getElementById('animegan-image').files.length);
});
"""


@pytest.mark.parametrize("kind", ["drop", "paste"])
def test_a_dropped_or_pasted_photo_is_converted(server, browser, kind):
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    photo_url = f"{server.url}/animegan/animegan-static/sample-photo.jpg"  # 192x192
    assert driver.execute_async_script(DROP_OR_PASTE, kind, photo_url) == 1
    wait_for(lambda: by_id(driver, "animegan-preview").is_displayed(), 10, "the preview")
    by_id(driver, "animegan-submit").click()
    result = by_id(driver, "animegan-result")
    wait_for(lambda: result.is_displayed() and natural_size(driver, result) == (192, 192),
             what="the result")  # a photo is never upscaled
    assert by_id(driver, "animegan-download").get_attribute("download") == (
        "dropped-toon_demo.jpg")


def test_with_javascript_a_non_image_is_explained_inline(server, browser, not_a_photo):
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    by_id(driver, "animegan-image").send_keys(str(not_a_photo))
    by_id(driver, "animegan-submit").click()
    error = by_id(driver, "animegan-error")
    wait_for(error.is_displayed, what="the inline error")
    assert "not an image this server can read" in error.text
    assert not by_id(driver, "animegan-result-panel").is_displayed()
    assert driver.current_url.endswith("/animegan/")


SLOW_FETCH = """
const fetchNow = window.fetch;
window.fetch = (...args) => new Promise(wait => setTimeout(wait, 700)).then(
    () => fetchNow(...args));
"""


def test_the_busy_clock_stops_before_an_error_shows(server, browser, not_a_photo):
    """An answer that takes a while (here: the request waits 0.7 s in the page) lets the
    clock tick; once the error shows, the status is empty and stays so."""
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    driver.execute_script(SLOW_FETCH + RECORD_STATUS)
    by_id(driver, "animegan-image").send_keys(str(not_a_photo))
    by_id(driver, "animegan-submit").click()
    error = by_id(driver, "animegan-error")
    wait_for(error.is_displayed, what="the inline error")
    time.sleep(0.5)  # five of the clock's periods
    assert by_id(driver, "animegan-status").text == ""
    statuses = driver.execute_script("return window.statuses")
    assert any(s.startswith("Converting\u2026 0.") for s in statuses), statuses  # it ticked
    assert statuses[-1] == "", statuses


@pytest.mark.parametrize("javascript", [True, False])
def test_rate_limited_conversions_say_how_long_to_wait(limited_server, browser, coffee_file,
                                                       javascript):
    """One conversion per minute per address; the second says when to come back."""
    driver = browser(javascript=javascript)
    error_text = ""
    for _ in range(2):  # the first may succeed (or the other parameter used the minute)
        driver.get(f"{limited_server.url}/animegan/")
        by_id(driver, "animegan-image").send_keys(str(coffee_file))
        by_id(driver, "animegan-submit").click()
        if javascript:
            wait_for(lambda: by_id(driver, "animegan-error").is_displayed()
                     or by_id(driver, "animegan-result-panel").is_displayed(), what="an answer")
        else:
            wait_for(lambda: "/result/" in driver.current_url
                     or by_id(driver, "animegan-error").is_displayed(), what="an answer")
        if "/result/" not in driver.current_url and by_id(driver, "animegan-error").is_displayed():
            error_text = by_id(driver, "animegan-error").text
    assert "too many conversions" in error_text.lower()
    seconds = int(error_text.split("try again in ")[1].split(" s")[0])
    assert 1 <= seconds <= 60


def test_keyboard_reaches_every_control(server, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    driver = browser()
    driver.get(f"{server.url}/animegan/")
    reached = []
    for _ in range(12):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        reached.append(driver.execute_script(
            "const e = document.activeElement; return e.id || e.name || e.tagName"))
    for control in ("animegan-image", "style", "animegan-size", "animegan-format",
                    "animegan-submit"):
        assert control in reached, reached


def test_the_page_fits_a_phone(server, browser):
    driver = browser()
    # a phone's viewport (headless Chromium windows are at least 500 px wide)
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": 375, "height": 740, "deviceScaleFactor": 2, "mobile": True})
    driver.get(f"{server.url}/animegan/")
    assert driver.execute_script("return window.innerWidth") == 375
    overflow = driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    save_screenshot(driver, "page-phone.png")


def test_a_touch_screen_gets_no_keyboard_hint(server, browser):
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    assert "(Ctrl+V)" in by_id(driver, "animegan-image-hint").text
    driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled",
                           {"enabled": True, "maxTouchPoints": 5})
    driver.get(f"{server.url}/animegan/")
    hint = by_id(driver, "animegan-image-hint").text
    assert "Ctrl" not in hint and "Tap Photo to take one with the camera" in hint, hint
