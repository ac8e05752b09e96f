"""The example app under the real gunicorn, started with the repository's gunicorn.conf.py."""

from __future__ import annotations

import concurrent.futures
import os
import re

import numpy as np
import pytest
import requests
from conftest import open_image, photo_bytes
from servers import Server

pytestmark = pytest.mark.server
@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    """gunicorn serving the example app, pinned to one CPU, on a free loopback port."""
    instance = Server({
        "ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_MAX_SIDE": "256",
        "ANIMEGAN_DEFAULT_STYLE": "test_style", "ANIMEGAN_RATE_LIMIT": "",
        "ANIMEGAN_ACCESS_LOG": "",
    }, log=tmp_path_factory.mktemp("gunicorn") / "log.txt",
        cpus={sorted(os.sched_getaffinity(0))[0]})
    yield instance
    instance.stop()


def test_healthz_reports_the_thread_cap_from_cpu_affinity(server):
    health = requests.get(f"{server.url}/animegan/healthz", timeout=10).json()
    assert health["status"] == "ok"
    assert health["torch_threads"] == 1  # the worker may use one CPU
    assert health["torch_interop_threads"] == 1
    assert health["loaded"][0] == "test_style"  # the default first; samples load the others


def test_curl_style_convert_returns_a_jpeg_of_the_configured_size(server):
    response = requests.post(f"{server.url}/animegan/convert", timeout=60,
                             files={"image": ("astronaut.jpg", photo_bytes("astronaut"))})
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "image/jpeg"
    image = open_image(response.content)
    assert image.format == "JPEG" and max(image.size) == 256


def test_browser_form_upload_shows_the_converted_photo(server):
    session = requests.Session()
    page = session.get(f"{server.url}/animegan/", timeout=10)
    assert 'enctype="multipart/form-data"' in page.text
    # the example app has a SECRET_KEY, so the form carries a CSRF token in the session
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)
    result = session.post(f"{server.url}/animegan/upload", timeout=60,
                          files={"image": ("coffee.jpg", photo_bytes("coffee"))},
                          data={"style": "test_style", "size": "256", "csrf_token": token})
    assert result.status_code == 200 and result.history[0].status_code == 303
    # the before/after view: the anime picture, and the photo over it
    frame = result.text.split('class="animegan-compare-frame"', 1)[1].split("</div>", 1)[0]
    sources = re.findall(r'<img[^>]+src="([^"]+)"', frame)
    assert len(sources) == 2 and sources[0] != sources[1]
    anime, original = (open_image(session.get(server.url + s, timeout=10).content)
                       for s in sources)
    assert original.size == anime.size == (256, 171)
    assert not np.array_equal(np.asarray(original), np.asarray(anime))


def test_the_site_keeps_its_own_pages(server):
    assert "Example site" in requests.get(server.url + "/", timeout=10).text
    assert requests.get(server.url + "/about", timeout=10).json()["site"] == "example"


def test_concurrent_clients_get_results_or_a_prompt_503(server):
    data = photo_bytes("rocket")

    def one(i: int) -> requests.Response:
        return requests.post(f"{server.url}/animegan/convert?size={200 + i}", data=data,
                             headers={"Content-Type": "image/jpeg"}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, range(8)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 1
    for response in responses:
        if response.status_code == 503:
            assert int(response.headers["Retry-After"]) >= 1
    assert requests.get(f"{server.url}/animegan/healthz", timeout=10).json()["in_flight"] == 0
