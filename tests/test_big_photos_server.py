"""A 3000 x 2000 photo at 3000 px under the real gunicorn (the shipped config, the example
app, jobs in memory: the app's own worker thread), with the test style's seeded weights:
its job page shows tile progress at least every 5 s, and a 512-px photo sent by another
client meanwhile waits at most about one tile (the engine takes the inference gate one
tile at a time, behind the conversions waiting). The 512-px photo's time on the idle
server and during the job are measured in the same run and printed with their ratio."""

from __future__ import annotations

import io
import itertools
import re
import statistics
import threading
import time

import pytest
import requests
from conftest import open_image, photo
from PIL import Image
from servers import Server
from test_browser import browser  # noqa: F401  the Chromium sessions' fixture

pytestmark = pytest.mark.server

#: The photo, the size asked for, the small photo's size, and how often each is read.
BIG = (3000, 2000)
SMALL_SIZE = 512
POLL_S = 0.5
#: Seconds the acceptance allows between two tile reports on the page.
REPORT_BOUND_S = 5.0
#: Small photos timed on the idle server, then during the job.
SAMPLES = 3
#: Seconds a job may take on a loaded 2-core machine before the test gives up.
DEADLINE = 600


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    instance = Server({
        "ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_DEFAULT_STYLE": "test_style",
        "ANIMEGAN_MAX_OUTPUT_SIDE": str(max(BIG)), "ANIMEGAN_RATE_LIMIT": "",
        "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_CACHE_TTL": "0",
        # the tiles run torch fp32 whatever serves whole pictures: the same here, so
        # that a tile and a small photo are timed on one backend
        "ANIMEGAN_BACKEND": "torch", "ANIMEGAN_PRECISION": "fp32",
        "ANIMEGAN_SAMPLE_SIZE": "0", "ANIMEGAN_WARMUP_SIZE": "64",
    }, log=tmp_path_factory.mktemp("gunicorn-big") / "log.txt")
    yield instance
    instance.stop()


def jpeg(name: str, size: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    photo(name).resize(size, Image.Resampling.LANCZOS).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def small_photo(server: Server, name: str) -> float:
    """Seconds one 512-px conversion takes, from a client of its own."""
    started = time.perf_counter()
    response = requests.post(f"{server.url}/animegan/convert?size={SMALL_SIZE}",
                             data=jpeg(name, (768, 512)),
                             headers={"Content-Type": "image/jpeg"}, timeout=120)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    assert max(open_image(response.content).size) == SMALL_SIZE
    return elapsed


def test_a_3000_px_photo_shows_tile_progress_and_leaves_room_for_small_ones(server):
    small_names = ["astronaut", "coffee", "chelsea", "rocket"]
    small_photo(server, "astronaut")  # the first request pays for its setup
    idle = [small_photo(server, small_names[i % 4]) for i in range(SAMPLES)]

    response = requests.post(f"{server.url}/animegan/convert?size={max(BIG)}",
                             data=jpeg("astronaut", BIG),
                             headers={"Content-Type": "image/jpeg"}, timeout=60)
    assert response.status_code == 202, response.text
    job = response.json()
    page_url = f"{server.url}{job['page_url']}"
    started = time.monotonic()
    shown: list[tuple[float, str]] = []  # (seconds since posted, the page's status line)
    busy: list[float] = []

    def others() -> None:  # another client's small photos, once the tiles run
        while not any(text.startswith("Tile ") for _, text in shown):
            time.sleep(0.05)
        for i in range(SAMPLES):
            busy.append(small_photo(server, small_names[(i + 1) % 4]))

    client = threading.Thread(target=others, daemon=True)
    client.start()
    state = "queued"
    while time.monotonic() - started < DEADLINE:  # as a visitor's page, without its script
        page = requests.get(page_url, timeout=30).text
        status = re.search(r'id="animegan-job-status"[^>]*>\s*(.*?)</p>', page, re.DOTALL)
        state_attr = re.search(r'id="animegan-job"[^>]*data-state="(\w+)"', page, re.DOTALL)
        assert status is not None and state_attr is not None, page
        text = re.sub(r"\s+", " ", status.group(1)).strip()
        if not shown or shown[-1][1] != text:
            shown.append((time.monotonic() - started, text))
        state = state_attr.group(1)
        if state not in ("queued", "running"):
            break
        time.sleep(POLL_S)
    client.join(120)
    assert state == "done", shown[-3:]

    tiles = [(at, int(m.group(1)), int(m.group(2))) for at, text in shown
             if (m := re.match(r"Tile (\d+) of (\d+)", text))]
    assert tiles and tiles[0][2] == 70  # 3000 x 2000 in 320-px tiles: 10 x 7
    times = [0.0] + [at for at, _ in shown]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    tile_gaps = [later[0] - earlier[0] for earlier, later in itertools.pairwise(tiles)]
    result = requests.get(f"{server.url}{job['url']}/result", timeout=60)
    assert result.headers["Content-Type"] == "image/jpeg"
    assert open_image(result.content).size == BIG

    ratio = statistics.median(busy) / statistics.median(idle)
    print(f"\n3000 x 2000 at 3000 px: {times[-1]:.1f} s, {len(tiles)} tile reports seen; "
          f"longest gap between two page updates {max(gaps):.2f} s (median between tiles "
          f"{statistics.median(tile_gaps):.2f} s, longest {max(tile_gaps):.2f} s)")
    print(f"512-px photo: idle {[round(t, 2) for t in idle]} s, during the job "
          f"{[round(t, 2) for t in busy]} s; median ratio {ratio:.2f}")
    # a report after each tile: a gap is one tile (about a small photo's inference) and the
    # conversions that went before it (one client's here): within 5 s on an idle machine,
    # and within three small photos' times on one that other work slows down
    assert max(gaps) <= max(REPORT_BOUND_S, 3 * max(idle + busy)), shown
    assert len(busy) == SAMPLES
    # by construction a small photo waits at most one tile (and the job's own decode and
    # encode, which run outside the gate): generous, on a machine shared with others
    assert max(busy) <= max(idle) + 2 * max(tile_gaps) + 2.0, (idle, busy, tile_gaps)


# -- in a browser: the job panel's tiles, and results at their own pixel size ------------

@pytest.fixture(scope="module")
def page_server(models_dir, tmp_path_factory):
    from conftest import need
    from test_browser import CHROMEDRIVER, CHROMIUM, start_server

    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    instance = start_server(tmp_path_factory.mktemp("big-page"), models_dir,
                            ANIMEGAN_MAX_OUTPUT_SIDE="1024", ANIMEGAN_BACKEND="torch")
    yield instance
    instance.stop()


@pytest.mark.browser
def test_the_page_follows_a_large_photo_by_tiles_and_draws_results_at_their_size(
        page_server, browser, tmp_path):  # noqa: F811 - the fixture imported above
    from test_browser import by_id, choose_size, natural_size, save_screenshot, wait_for

    big = tmp_path / "coffee-large.jpg"
    big.write_bytes(jpeg("coffee", (1200, 800)))
    driver = browser(width=1280, height=1100)
    driver.get(f"{page_server.url}/animegan/")
    sizes = [o.get_attribute("value") for o in
             by_id(driver, "animegan-size").find_elements("tag name", "option")]
    assert sizes[-2:] == ["768", "1024"]  # up to ANIMEGAN_MAX_OUTPUT_SIDE

    # a 512-px result: drawn at most 512 CSS px wide (it was stretched to 768)
    by_id(driver, "animegan-image").send_keys(str(big))
    choose_size(driver, 512)
    by_id(driver, "animegan-submit").click()
    result = wait_for(lambda: by_id(driver, "animegan-result-panel").is_displayed()
                      and by_id(driver, "animegan-result"), what="the result")
    wait_for(lambda: natural_size(driver, result)[0] == 512, what="the result's pixels")
    assert result.size["width"] <= 512
    before = driver.find_element("css selector", ".animegan-compare-before")
    assert before.size["width"] == result.size["width"]  # the slider compares like with like
    save_screenshot(driver, "bigphoto-512-result.png", top=by_id(driver, "animegan-result-panel"))

    # a size that runs in tiles: the job panel counts them, then shows the picture
    choose_size(driver, 1024)
    by_id(driver, "animegan-submit").click()
    status = by_id(driver, "animegan-job-status")
    seen = wait_for(lambda: re.match(r"Tile \d+ of 12", status.text) and status.text,
                    what="tile progress")
    save_screenshot(driver, "bigphoto-tiles.png", top=by_id(driver, "animegan-job-panel"))
    image = wait_for(lambda: by_id(driver, "animegan-job-image").is_displayed()
                     and by_id(driver, "animegan-job-image"), what="the job's picture")
    wait_for(lambda: natural_size(driver, image)[0] == 1024, what="the picture's pixels")
    assert status.text == "Done: 12 tiles." and seen
    assert by_id(driver, "animegan-job-panel-title").text == "Your large photo"
    save_screenshot(driver, "bigphoto-job-result.png", top=by_id(driver, "animegan-job-panel"))
