"""Jobs on the page, in a real browser: Debian's headless Chromium against the real gunicorn
serving the example app with the shipped ``toon_demo``. With JavaScript, the upload form
sends an animation to ``POST /jobs`` and its progress bar advances until the result shows;
without, the form's ``/upload`` lands on the job's page, which refreshes itself until the
result and its download link are there.

Screenshots are saved under the test's tmp folder; their paths are printed (``pytest -s``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need
from media import gif_from_photos, video_clip
from PIL import Image
from servers import Server
from test_browser import (  # noqa: F401
    CHROMEDRIVER,
    CHROMIUM,
    browser,
    shipped_toon_demo,
    wait_for,
)

pytestmark = [pytest.mark.server, pytest.mark.browser]

WAIT = 180  # seconds: a few dozen frames with toon_demo on a busy 2-core machine
#: TEMPORARY: the app module served, until extension.py imports web/jobs.py (J3's wiring)
SITE = "import flask_animegan.web.jobs  # noqa: F401\nfrom example_app import app  # noqa: F401\n"


@pytest.fixture(scope="module")
def server(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    need(CHROMIUM is not None and CHROMEDRIVER is not None,
         "the browser tests need Debian's chromium and chromium-driver "
         "(apt-get install chromium chromium-driver)")
    tmp = tmp_path_factory.mktemp("jobs-page-server")
    models = tmp / "models"
    models.mkdir()
    shutil.copy(shipped_toon_demo(), models)
    (tmp / "jobs_site.py").write_text(SITE)
    instance = Server({
        "ANIMEGAN_MODELS_DIR": str(models), "ANIMEGAN_DEFAULT_STYLE": "toon_demo",
        "ANIMEGAN_BACKEND": "torch", "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_ACCESS_LOG": "",
        "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_MAX_SIDE": "256", "PYTHONPATH": str(tmp),
    }, log=tmp / "gunicorn.log", app="jobs_site:app")
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def media_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("media")
    files = {"gif": folder / "chelsea.gif", "mp4": folder / "coffee.mp4"}
    files["gif"].write_bytes(gif_from_photos(36, size=(192, 128), durations=80))
    files["mp4"].write_bytes(video_clip(2.0, fps=12, size=(192, 128), name="coffee"))
    return files


def screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def bar(driver) -> tuple[float, float]:
    value, maximum = driver.execute_script(
        "var b = document.getElementById('animegan-job-bar'); return [b.value, b.max];")
    return float(value), float(maximum)


def test_with_javascript_the_progress_bar_advances_then_the_result_shows(
        server, browser, media_files, tmp_path):  # noqa: F811 - the fixture from test_browser
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    driver.find_element("id", "animegan-image").send_keys(str(media_files["gif"]))
    driver.find_element("id", "animegan-submit").click()
    seen: list[float] = []
    shot_midway = None
    stop = time.monotonic() + WAIT
    while time.monotonic() < stop:
        state = driver.execute_script(
            "return document.getElementById('animegan-job-panel').dataset.state || '';")
        value, maximum = bar(driver)
        if not seen or value != seen[-1]:
            seen.append(value)
        if shot_midway is None and 0 < value < maximum:
            shot_midway = screenshot(driver, tmp_path, "job-js-progress.png")
        if state in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    assert state == "done", (state, driver.find_element("id", "animegan-error").text)
    assert maximum == 36 and seen[-1] == 36
    midway = [v for v in seen if 0 < v < 36]
    assert len(midway) >= 2, f"the bar should move through several values: {seen}"
    assert seen == sorted(seen)
    assert "Done: 36 of 36 frames" in driver.find_element("id", "animegan-job-status").text
    image = driver.find_element("id", "animegan-job-image")
    assert image.is_displayed()
    assert driver.execute_script("return arguments[0].naturalWidth", image) == 192
    download = driver.find_element("id", "animegan-job-download")
    assert download.is_displayed() and download.get_attribute("href").endswith("?download=1")
    assert download.get_attribute("download") == "chelsea-toon_demo.gif"
    driver.execute_script("arguments[0].scrollIntoView()",
                          driver.find_element("id", "animegan-job-panel"))
    screenshot(driver, tmp_path, "job-js-done.png")


def test_with_javascript_a_video_shows_as_a_video(
        server, browser, media_files, tmp_path):  # noqa: F811 - the fixture from test_browser
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    driver.find_element("id", "animegan-image").send_keys(str(media_files["mp4"]))
    driver.find_element("id", "animegan-submit").click()
    stop = time.monotonic() + WAIT
    state = ""
    while time.monotonic() < stop and state not in ("done", "failed", "cancelled"):
        time.sleep(0.3)
        state = driver.execute_script(
            "return document.getElementById('animegan-job-panel').dataset.state || '';")
    assert state == "done", driver.find_element("id", "animegan-error").text
    video = driver.find_element("id", "animegan-job-video")
    assert video.is_displayed() and video.get_attribute("src").endswith("/result")
    assert driver.find_element("id", "animegan-job-download").get_attribute(
        "download") == "coffee-toon_demo.mp4"
    driver.execute_script("arguments[0].scrollIntoView()",
                          driver.find_element("id", "animegan-job-panel"))
    screenshot(driver, tmp_path, "job-js-video.png")


def status_text(driver) -> str | None:
    """The job page's status line, or None while the page is being replaced by its
    refresh (the element found, then gone before its text is read)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("id", "animegan-job-status").text
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def test_without_javascript_the_job_page_refreshes_until_the_result(
        server, browser, media_files, tmp_path):  # noqa: F811 - the fixture from test_browser
    driver = browser(javascript=False)
    driver.get(f"{server.url}/animegan/")
    driver.find_element("id", "animegan-image").send_keys(str(media_files["gif"]))
    driver.find_element("id", "animegan-submit").click()
    # the form's POST is a navigation: the click may return before the job page is there
    wait_for(lambda: "/animegan/jobs/" in driver.current_url, what="the job page")
    assert driver.current_url.endswith("/page"), driver.current_url
    screenshot(driver, tmp_path, "job-no-js-progress.png")
    first = status_text(driver)
    stop = time.monotonic() + WAIT
    statuses = [first]
    while time.monotonic() < stop:
        time.sleep(0.5)
        text = status_text(driver)  # after a refresh
        if text is not None and text != statuses[-1]:
            statuses.append(text)
        if text is not None and text.startswith("Done"):
            break
    assert statuses[-1].startswith("Done: 36 of 36 frames"), statuses
    assert len(statuses) >= 3, f"the page should refresh with new progress: {statuses}"
    output = driver.find_element("id", "animegan-job-output")
    assert driver.execute_script("return arguments[0].naturalWidth", output) == 192
    screenshot(driver, tmp_path, "job-no-js-done.png")


#: Plays the video at arguments[0] and, once Chromium has presented a frame, draws it on
#: a canvas and hands back the colour of its centre (or the media error). Drawn at
#: "loadeddata" alone, a frame was sometimes still blank (0,0,0) on a busy machine.
_CENTRE_COLOUR = """
const [url, done] = arguments;
const video = document.createElement('video');
video.muted = true;
video.loop = true;
const draw = (tries) => {
  const canvas = document.createElement('canvas');
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  const context = canvas.getContext('2d');
  context.drawImage(video, 0, 0);
  const pixel = Array.from(
    context.getImageData(canvas.width >> 1, canvas.height >> 1, 1, 1).data);
  if ((pixel[3] !== 255 || pixel[0] + pixel[1] + pixel[2] === 0) && tries > 0) {
    video.requestVideoFrameCallback(() => draw(tries - 1));
  } else {
    video.pause();
    done(pixel.slice(0, 3));
  }
};
video.onloadeddata = () => {
  video.requestVideoFrameCallback(() => draw(20));
  video.play().catch((error) => done('play: ' + error));
};
video.onerror = () => done('media error ' + (video.error && video.error.code));
video.src = url;
"""


@pytest.mark.parametrize("size", [(320, 240), (1280, 720)], ids=["SD", "HD"])
def test_in_chromium_an_mp4_result_shows_its_colours(browser, tmp_path, size):  # noqa: F811
    """What Chromium draws of the MP4 a video job writes is the frame's colour. Untagged,
    it read an HD result with BT.709's matrix: green 30,200,30 showed as 16,174,29."""
    import functools
    import http.server
    import threading

    from test_encoders import COLOURS

    from flask_animegan.outputs.animations import Mp4Join, Mp4Writer
    from flask_animegan.outputs.segments import Segment

    need(CHROMIUM is not None and CHROMEDRIVER is not None,
         "the browser tests need Debian's chromium and chromium-driver")
    for index, colour in enumerate(COLOURS):  # a segment joined, as a job's result is
        writer = Mp4Writer(fps=2, quality=95)
        for _ in range(2):
            writer.add(Image.new("RGB", size, colour), 500, None)
        joined = Mp4Join(None).join([Segment(0, 0, 2, 0, 0.0, 1.0, writer.finish())])
        (tmp_path / f"{index}.mp4").write_bytes(joined)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    files = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=files.serve_forever, daemon=True).start()
    try:
        driver = browser()
        driver.set_script_timeout(60)
        base = f"http://127.0.0.1:{files.server_port}"
        driver.get(f"{base}/")
        shown = [driver.execute_async_script(_CENTRE_COLOUR, f"{base}/{index}.mp4")
                 for index in range(len(COLOURS))]
    finally:
        files.shutdown()
        files.server_close()
    for got, want in zip(shown, COLOURS, strict=True):
        assert isinstance(got, list), got
        assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 4, (shown, COLOURS)


def job_state(url: str) -> dict:
    import requests

    return requests.get(url, headers={"Accept": "application/json"}, timeout=10).json()


def test_the_job_page_plays_the_first_segment_before_the_job_ends(
        server, browser, tmp_path):  # noqa: F811 - the fixture from test_browser
    """A 12-second video: once its first two-second segment is converted, the job's page
    plays the part converted so far (muted, as a browser lets a page start a video) while
    the worker converts the rest; it moves on to longer parts, then shows the result."""
    import requests

    clip = video_clip(12.0, fps=8, size=(192, 128), name="coffee")
    posted = requests.post(f"{server.url}/animegan/jobs?size=160", data=clip,
                           headers={"Content-Type": "video/mp4",
                                    "Accept": "application/json"}, timeout=60)
    assert posted.status_code == 202, posted.text
    job_url = f"{server.url}{posted.json()['url']}"
    driver = browser()
    driver.get(f"{server.url}{posted.json()['page_url']}")
    # the page refreshes itself until a segment is done, then plays it
    wait_for(lambda: driver.find_elements("id", "animegan-job-partial"),
             what="the part converted so far")
    playing = """
        const video = document.getElementById('animegan-job-partial');
        return video && !video.paused && video.readyState >= 2 && video.currentTime > 0.5
            ? [video.currentTime, video.duration, video.videoWidth] : null;"""
    seen = wait_for(lambda: driver.execute_script(playing), what="the part playing")
    job = job_state(job_url)
    print(f"playing at {seen[0]:.1f} s of a {seen[1]:.1f} s part, {seen[2]} px wide, while "
          f"the job is {job['state']} at {job['frames_done']} of {job['frames_total']} frames")
    assert job["state"] == "running" and job["frames_done"] < job["frames_total"], job
    assert seen[2] == 160
    screenshot(driver, tmp_path, "job-partial-playing.png")
    # it plays on into longer parts, then the page shows the whole result
    wait_for(lambda: job_state(job_url)["state"] == "done", WAIT, what="the job's end")
    wait_for(lambda: driver.find_elements("id", "animegan-job-output"), WAIT,
             what="the result")
    output = driver.find_element("id", "animegan-job-output")
    assert output.get_attribute("src").endswith("/result")
    assert not driver.find_elements("id", "animegan-job-partial")
    screenshot(driver, tmp_path, "job-partial-done.png")


def test_with_javascript_the_form_plays_the_part_converted_so_far(
        server, browser, tmp_path):  # noqa: F811 - the fixture from test_browser
    """The form's job panel (where a visitor with JavaScript stays) plays the first segment
    while the rest converts, then puts the whole result in its place."""
    clip = tmp_path / "coffee.mp4"
    clip.write_bytes(video_clip(12.0, fps=8, size=(192, 128), name="coffee"))
    driver = browser()
    driver.get(f"{server.url}/animegan/")
    driver.find_element("id", "animegan-image").send_keys(str(clip))
    driver.find_element("id", "animegan-submit").click()
    playing = """
        const video = document.getElementById('animegan-job-partial');
        const panel = document.getElementById('animegan-job-panel');
        return !video.hidden && !video.paused && video.currentTime > 0.5
            ? [panel.dataset.state, video.currentTime] : null;"""
    state, at = wait_for(lambda: driver.execute_script(playing), WAIT,
                         what="the part playing in the panel")
    print(f"the panel plays the part converted so far at {at:.1f} s while the job is {state}")
    assert state == "running"
    driver.execute_script("arguments[0].scrollIntoView()",
                          driver.find_element("id", "animegan-job-panel"))
    screenshot(driver, tmp_path, "job-panel-partial.png")
    wait_for(lambda: driver.execute_script(
        "return document.getElementById('animegan-job-panel').dataset.state === 'done'"),
        WAIT, what="the job's end")
    assert driver.execute_script(
        "return document.getElementById('animegan-job-partial').hidden")
    assert driver.find_element("id", "animegan-job-video").get_attribute(
        "src").endswith("/result")
