"""The page's options in a real browser (Chromium): portrait mode on a group photo and
``colors=keep``, through the real gunicorn; screenshots in artifacts/screenshots/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import encode_image, need, open_image, photo
from faces_corpus import corpus
from test_browser import (
    CHROMEDRIVER,
    CHROMIUM,
    browser,  # noqa: F401 - a fixture
    by_id,
    natural_size,
    save_screenshot,
    start_server,
    wait_for,
)

pytestmark = [pytest.mark.server, pytest.mark.browser]


@pytest.fixture(scope="module")
def server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    instance = start_server(tmp_path_factory.mktemp("options-server"), models_dir,
                            ANIMEGAN_MAX_SIDE="768")
    yield instance
    instance.stop()


def group_photo(folder: Path) -> tuple[Path, int]:
    """A picture of the generated face corpus with three faces of 105-200 px at 768 px."""
    picture = corpus()[2]  # faces 336, 222 and 176 px at 1280
    if len([f for f in picture.faces if f.side >= 160]) < 3:
        pytest.fail("the corpus picture changed: pick another with three large faces")
    path = folder / "group.jpg"
    path.write_bytes(encode_image(picture.image, quality=92))
    return path, len(picture.faces)


def convert_on_page(driver, server, path: Path, **options: str):
    from selenium.webdriver.support.select import Select

    driver.get(f"{server.url}/animegan/")
    by_id(driver, "animegan-image").send_keys(str(path))
    for name, value in options.items():
        Select(by_id(driver, f"animegan-{name}")).select_by_value(value)
    by_id(driver, "animegan-submit").click()
    wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed(), what="the result")
    result = by_id(driver, "animegan-result")
    wait_for(lambda: natural_size(driver, result)[0] > 0, 10, "the result image")
    return result


def test_portrait_mode_on_a_group_photo(server, browser, tmp_path):  # noqa: F811
    path, placed = group_photo(tmp_path)
    driver = browser()
    result = convert_on_page(driver, server, path, portrait="on")
    assert natural_size(driver, result) == (768, 576)
    note = by_id(driver, "animegan-result-note").text
    found = int(note.split(" face")[0])
    assert 2 <= found <= placed, note
    assert "found and converted on their own" in note
    save_screenshot(driver, "portrait-group.png", top=by_id(driver, "animegan-result-title"))


def test_colors_keep_on_the_page(server, browser, tmp_path):  # noqa: F811
    source = tmp_path / "coffee.jpg"
    source.write_bytes(encode_image(photo("coffee"), quality=92))
    driver = browser()
    result = convert_on_page(driver, server, source, colors="keep", portrait="off")
    assert natural_size(driver, result) == (600, 400)
    assert "colours were kept" in by_id(driver, "animegan-result-note").text
    # the picture shown is the one the API gives: its mean colour is the photo's
    shown = driver.execute_script("""const img = arguments[0], c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const g = c.getContext('2d'); g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data; let s = [0, 0, 0];
        for (let i = 0; i < d.length; i += 4) { s[0] += d[i]; s[1] += d[i+1]; s[2] += d[i+2]; }
        return s.map(v => v / (d.length / 4));""", result)
    original = np.asarray(photo("coffee"), np.float64).reshape(-1, 3).mean(axis=0)
    assert np.abs(np.array(shown) - original).max() < 25, (shown, original)
    save_screenshot(driver, "colors-keep.png", top=by_id(driver, "animegan-result-title"))
    assert open_image(source.read_bytes()).size == (600, 400)
