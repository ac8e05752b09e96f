"""Photos that run in tiles are jobs (docs/large-photos.md, "Large photos as jobs"): through
the API and the form, on the embedded local queue, with their progress in tiles, cancellable;
smaller photos still answer in the request; the page offers the sizes the site allows and
draws a result no larger than its pixels. The real gunicorn run: tests/test_big_photos_server.py."""

from __future__ import annotations

import io
import re
import threading
import time

import pytest
from conftest import open_image, photo
from PIL import Image

from flask_animegan.gate import Gate

#: The largest size the test app allows, and a size that runs in tiles (above 512 px).
LARGEST = 1536
TILED = 768
#: Seconds a tiled job may take on a busy 2-core machine before the test gives up.
DEADLINE = 180


@pytest.fixture(scope="module")
def big_app(models_dir, openvino_cache):
    from conftest import build_app

    return build_app(models_dir, openvino_cache, ANIMEGAN_MAX_OUTPUT_SIDE=LARGEST)


@pytest.fixture
def big_client(big_app):
    return big_app.test_client()


def large_photo(width: int = 1200, height: int = 800, fmt: str = "JPEG") -> bytes:
    """A photo large enough that a size above 512 px is not capped by its own pixels."""
    buffer = io.BytesIO()
    photo("chelsea").resize((width, height), Image.Resampling.LANCZOS).save(buffer, fmt)
    return buffer.getvalue()


def post(client, url: str, body: bytes, **params: object):
    return client.post(url, query_string=params, data=body,
                       content_type="application/octet-stream")


def follow(client, url: str, until=("done", "failed", "cancelled")) -> list[dict]:
    seen = []
    stop = time.monotonic() + DEADLINE
    while time.monotonic() < stop:
        response = client.get(url)
        assert response.status_code == 200, response.get_json()
        seen.append(response.get_json())
        if seen[-1]["state"] in until:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"the job did not end within {DEADLINE} s: {seen[-1]}")


@pytest.mark.parametrize("fmt,mimetype", [("jpeg", "image/jpeg"), ("png", "image/png")])
def test_a_tiled_photo_through_the_api_is_a_job_with_tile_progress(big_client, fmt, mimetype):
    response = post(big_client, "/animegan/convert", large_photo(), size=TILED, format=fmt)
    assert response.status_code == 202, response.get_json()
    job = response.get_json()
    assert response.headers["Location"] == job["url"]
    assert job["kind"] == "photo" and job["tiles_total"] == 6  # 768 x 512 in 320-px tiles
    seen = follow(big_client, job["url"])
    assert seen[-1]["state"] == "done", seen[-1]
    running = [s for s in seen if s["state"] == "running"]
    assert {s["tiles_total"] for s in running} <= {0, 6}  # 0 while the photo is read
    done_counts = [s["tiles_done"] for s in running]
    assert done_counts == sorted(done_counts)
    assert seen[-1]["tiles_done"] == 6 and seen[-1]["progress"] == 1
    assert seen[-1]["result_mimetype"] == mimetype
    result = big_client.get(seen[-1]["result_url"])
    assert result.status_code == 200 and result.mimetype == mimetype
    assert open_image(result.data).size == (TILED, 512)
    preview = big_client.get(seen[-1]["preview_url"])
    assert preview.mimetype == "image/jpeg" and max(open_image(preview.data).size) <= 512
    download = big_client.get(seen[-1]["download_url"])
    assert download.headers["Content-Disposition"].endswith(
        '.jpg"' if fmt == "jpeg" else '.png"')


def test_a_tiled_photo_sent_to_the_job_api_is_a_job(big_client):
    response = post(big_client, "/animegan/jobs", large_photo(), size=TILED)
    assert response.status_code == 202, response.get_json()
    seen = follow(big_client, response.headers["Location"])
    assert seen[-1]["state"] == "done" and seen[-1]["kind"] == "photo"


def test_a_photo_that_runs_whole_still_answers_in_the_request(big_client):
    body = large_photo()
    response = post(big_client, "/animegan/convert", body, size=512)
    assert response.status_code == 200 and response.mimetype == "image/jpeg"
    assert open_image(response.data).size == (512, 341)
    # a size that would tile, but the photo's own pixels keep it whole
    small = post(big_client, "/animegan/convert", large_photo(450, 300), size=TILED)
    assert small.status_code == 200 and open_image(small.data).size == (450, 300)
    # at /jobs it is pointed back to /convert
    refused = post(big_client, "/animegan/jobs", body, size=512)
    assert refused.status_code == 415 and refused.get_json()["convert_url"]


def test_the_form_sends_a_tiled_photo_to_its_job_page(big_client):
    form = {"image": (io.BytesIO(large_photo()), "big.jpg", "image/jpeg"),
            "size": str(TILED), "format": "webp"}
    response = big_client.post("/animegan/upload", data=form,
                               content_type="multipart/form-data")
    assert response.status_code == 303
    page_url = response.headers["Location"]
    assert page_url.endswith("/page")
    page = big_client.get(page_url).get_data(as_text=True)
    assert re.search(r"(Waiting for a worker|Reading the photo|Tile \d of 6)", page), page
    job_url = page_url.rsplit("/page", 1)[0]
    seen = follow(big_client, job_url)
    assert seen[-1]["state"] == "done" and seen[-1]["result_mimetype"] == "image/webp"
    page = big_client.get(page_url).get_data(as_text=True)
    assert "Your anime picture" in page and seen[-1]["result_url"] in page
    assert "animegan-job-photo" in page and "Done: 6 tiles." in page


def test_a_tiled_photo_job_is_cancelled_between_tiles(big_client):
    response = post(big_client, "/animegan/convert", large_photo(1800, 1200), size=LARGEST)
    assert response.status_code == 202
    url = response.headers["Location"]
    follow(big_client, url, until=("running", "done", "failed", "cancelled"))
    cancel = big_client.delete(url)
    assert cancel.status_code in (200, 202), cancel.get_json()
    seen = follow(big_client, url)
    assert seen[-1]["state"] == "cancelled", seen[-1]
    assert seen[-1]["tiles_done"] < seen[-1]["tiles_total"] == 20  # 1536 x 1024
    assert big_client.get(f"{url}/result").status_code == 409


def test_the_page_offers_the_sizes_the_site_allows(big_client, client):
    page = big_client.get("/animegan/").get_data(as_text=True)
    offered = [int(v) for v in re.findall(r'<option value="(\d+)"', page)]
    assert LARGEST in offered and 1024 in offered and 128 in offered
    # the test app's default: nothing above ANIMEGAN_MAX_SIDE (128) to offer
    small = client.get("/animegan/").get_data(as_text=True)
    sizes = small.split('id="animegan-size"', 1)[1].split("</select>", 1)[0]
    assert re.findall(r'value="(\d+)"', sizes) == ["128"]


def test_a_tile_waits_behind_the_conversions_waiting():
    """The rule small photos rely on: a piece of long work (``behind``) takes the slot only
    after every conversion already waiting for it."""
    gate = Gate(max_queue=4, queue_timeout=30)
    order: list[str] = []
    held = threading.Event()

    def take(name: str, behind: bool) -> None:
        with gate.slot(behind=behind):
            order.append(name)

    with gate.slot():  # a tile runs
        held.set()
        waiter = threading.Thread(target=take, args=("photo", False))
        waiter.start()
        while gate.waiting < 1:
            time.sleep(0.001)
        tile = threading.Thread(target=take, args=("next tile", True))
        tile.start()
        time.sleep(0.05)
    waiter.join(10)
    tile.join(10)
    assert order == ["photo", "next tile"]


def test_a_tiled_photo_job_runs_on_an_rq_worker(make_app, redis_server):
    """With Redis, the photo's job waits in RQ's queue and a worker (here one burst run in
    this process, as `flask animegan worker` runs) converts it, its record stored in Redis."""
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, SECRET_KEY="big-photos",
                   ANIMEGAN_MAX_OUTPUT_SIDE=LARGEST)
    client = app.test_client()
    response = post(client, "/animegan/convert", large_photo(), size=TILED, format="png")
    assert response.status_code == 202, response.get_json()
    url = response.headers["Location"]
    assert client.get(url).get_json()["state"] == "queued"
    with app.app_context():
        app.extensions["animegan"].jobs.queue.work(burst=True)
    job = client.get(url).get_json()
    assert job["state"] == "done" and job["tiles_done"] == job["tiles_total"] == 6, job
    result = client.get(job["result_url"])
    assert result.mimetype == "image/png" and open_image(result.data).size == (TILED, 512)


@pytest.mark.parametrize("route", ["/animegan/convert", "/animegan/jobs"])
def test_a_photo_job_costs_its_pixels_through_either_route(make_app, route):
    """A tiled photo is charged as the same photo converted in the request would be: one
    conversion per ANIMEGAN_MAX_SIDE squared pixels, whichever route queued it."""
    app = make_app(ANIMEGAN_MAX_OUTPUT_SIDE=LARGEST, ANIMEGAN_RATE_LIMIT="30 per minute",
                   ANIMEGAN_MAX_SIDE=256)
    client = app.test_client()
    response = post(client, route, large_photo(), size=TILED)
    assert response.status_code == 202, response.get_json()
    side = app.extensions["animegan"].settings.max_side
    cost = -(-TILED * 512 // side ** 2)  # 768 x 512 in 256-px units, begun
    after = post(client, "/animegan/convert", b"not an image", size=64)  # a refusal: free
    assert after.status_code in (400, 415)
    assert int(after.headers["X-RateLimit-Remaining"]) == 30 - cost
    assert client.delete(response.headers["Location"]).status_code in (200, 202, 409)
