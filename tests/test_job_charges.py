"""What jobs are charged: the frames decoded, not what the container's header claims.

Two containers that lie are rebuilt here: a VP8 WebM muxed live (no Duration, so no count)
and a Matroska file whose Duration element is rewritten to 40 ms (one frame, it says)."""

from __future__ import annotations

import io
import struct

import av
import pytest
from conftest import photo_bytes
from media import camera_move
from test_jobs_api import SIZE, post_job, wait_for

from flask_animegan.config import FRAMES_PER_CONVERSION
from flask_animegan.jobs.records import JobState

LIMIT = 10  # conversions a minute
#: More frames than the limit pays for: the job must stop at LIMIT * FRAMES_PER_CONVERSION.
FRAMES = LIMIT * FRAMES_PER_CONVERSION + 50
#: Matroska's Duration element: its id and an 8-byte float's size.
DURATION = b"\x44\x89\x88"


def vp8(count: int, muxer: str, options: dict[str, str] | None = None) -> bytes:
    """``count`` small VP8 frames at 10 a second in ``muxer`` (webm or matroska)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer, options=options or {}) as out:
        video = out.add_stream("libvpx", rate=10)
        video.width, video.height = 64, 48
        video.pix_fmt = "yuv420p"
        video.options = {"deadline": "realtime", "cpu-used": "8"}
        for index, image in enumerate(camera_move(count, (64, 48))):
            frame = av.VideoFrame.from_image(image)
            frame.pts = index
            out.mux(video.encode(frame))
        out.mux(video.encode(None))
    return buffer.getvalue()


def live_webm(count: int) -> bytes:
    """A WebM written as a live stream: no Duration, no cues, so no frame count."""
    return vp8(count, "webm", {"live": "1"})


def short_mkv(count: int) -> bytes:
    """A Matroska file whose Segment Info says it lasts 40 ms (it holds ``count`` frames)."""
    data = bytearray(vp8(count, "matroska"))
    at = data.find(DURATION)
    assert at > 0, "no Duration element to rewrite"
    data[at + 3:at + 11] = struct.pack(">d", 40.0)  # in TimecodeScale units: milliseconds
    return bytes(data)


@pytest.fixture
def limited(make_app):
    app = make_app(ANIMEGAN_RATE_LIMIT=f"{LIMIT} per minute", ANIMEGAN_JOBS_PER_CLIENT=10)
    return app, app.test_client()


def _decoded(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def _probed(app, data: bytes) -> int:
    with app.app_context():
        return app.extensions["animegan"].jobs.probe(data).frames


def _remaining(client) -> int:
    """What is left of the limit, read from the answer to a request that costs nothing."""
    response = client.post("/animegan/convert", data=b"not an image",
                           content_type="image/jpeg")
    assert response.status_code in (400, 429)  # 429: none left
    return int(response.headers["X-RateLimit-Remaining"])


@pytest.mark.parametrize(("build", "claimed"), [(live_webm, 0), (short_mkv, 1)],
                         ids=["live-webm", "mkv-40ms"])
def test_a_lying_container_stops_at_the_clients_allowance(limited, build, claimed):
    app, client = limited
    data = build(FRAMES)
    assert _decoded(data) == FRAMES and _probed(app, data) == claimed  # it does lie
    response = post_job(client, data, "raw", size=str(SIZE))
    assert response.status_code == 202, response.get_json()
    job = wait_for(client, response.headers["Location"])[-1]
    paid = LIMIT * FRAMES_PER_CONVERSION
    # the finished part is kept, and says why it ends there
    assert job["state"] == "done", job
    assert f"the rate limit ran out after {paid} frames" in job["error"]
    assert job["frames_done"] == job["frames_total"] == paid + 1  # the frame that found no room
    result = client.get(job["result_url"])
    assert result.status_code == 200 and _decoded(result.data) == paid + 1
    page = client.get(job["page_url"]).get_data(as_text=True)
    assert "the rate limit ran out" in page
    assert _remaining(client) == 0
    refused = client.post("/animegan/convert", data=photo_bytes("coffee"),
                          content_type="image/jpeg", query_string={"size": str(SIZE)})
    assert refused.status_code == 429


def test_a_header_without_a_length_is_refunded_what_it_did_not_use(limited):
    _, client = limited
    data = live_webm(30)  # 2 conversions' worth, charged the whole limit at the door
    response = post_job(client, data, "raw", size=str(SIZE))
    assert response.status_code == 202 and response.headers["X-RateLimit-Remaining"] == "0"
    job = wait_for(client, response.headers["Location"])[-1]
    assert job["state"] == "done" and job["frames_done"] == 30 and job["error"] is None, job
    assert _remaining(client) == LIMIT - 2


def test_a_header_without_a_length_waits_for_a_whole_allowance(limited):
    _, client = limited
    assert client.post("/animegan/convert", data=photo_bytes("coffee"),
                       content_type="image/jpeg",
                       query_string={"size": str(SIZE)}).status_code == 200
    refused = post_job(client, live_webm(30), "raw", size=str(SIZE))
    assert refused.status_code == 429, refused.get_json()
    assert "gives no length" in refused.get_json()["error"]
    assert _remaining(client) == LIMIT - 1  # the refusal cost nothing


def test_an_honest_file_is_charged_its_frames_once(limited):
    app, client = limited
    data = vp8(60, "webm")  # 3 conversions, said in its header
    assert _probed(app, data) == 60
    response = post_job(client, data, "raw", size=str(SIZE))
    assert response.status_code == 202 and response.headers["X-RateLimit-Remaining"] == "7"
    job = wait_for(client, response.headers["Location"])[-1]
    assert job["state"] == "done" and job["frames_done"] == 60, job
    assert _remaining(client) == LIMIT - 3


@pytest.mark.redis
@pytest.mark.server
def test_in_an_rq_worker_a_lying_container_is_charged_its_frames(
        make_app, redis_server, models_dir, tmp_path):
    """The worker is another process: it charges through the limit's Redis under the key
    the door recorded on the job."""
    from test_jobs_workers import (
        SECRET,
        TIMEOUT,
        Workers,
        wait_for_state,
        wait_for_workers,
        worker_env,
    )

    limit = f"{LIMIT} per minute"
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, SECRET_KEY=SECRET,
                   ANIMEGAN_JOB_WORKER_TIMEOUT=TIMEOUT, ANIMEGAN_RATE_LIMIT=limit)
    service = app.extensions["animegan"]
    client = app.test_client()
    env = {**worker_env(models_dir, redis_server.uri, TIMEOUT), "ANIMEGAN_RATE_LIMIT": limit}
    workers = Workers(env, tmp_path)
    try:
        workers.start("charges")
        wait_for_workers(service, 1)
        response = post_job(client, short_mkv(FRAMES), "raw", size=str(SIZE))
        assert response.status_code == 202, response.get_json()
        assert response.headers["X-RateLimit-Remaining"] == str(LIMIT - 1)
        record = wait_for_state(service, response.get_json()["id"],
                                lambda r: r.finished, timeout=180)
        assert record.state == JobState.DONE, record
        paid = LIMIT * FRAMES_PER_CONVERSION
        assert f"the rate limit ran out after {paid} frames" in (record.error or "")
        assert record.charged == LIMIT
        assert _remaining(client) == 0  # taken in Redis by the worker, read by the web app
    finally:
        workers.stop()
