"""The job API through the Flask test client, on the embedded local queue: the 202 and
Location flow to a result, progress, cancel, unknown ids, the pointers between /convert
and /jobs, the limits at the door, and generated corrupt animations and videos (every
short prefix and a sample of longer ones, seeded bit flips) through the API and the form:
a job or a clear refusal, never a 5xx."""

from __future__ import annotations

import io
import logging
import re
import time
from collections import Counter, defaultdict

import av
import pytest
from conftest import build_app, open_image, photo_bytes
from flask import got_request_exception
from media import (
    apng,
    decoded_video,
    gif_from_photos,
    isolated_clip,
    video_clip,
    webp_animation,
)
from PIL import Image
from upload_variants import bit_flips, prefixes

from flask_animegan.config import JOB_STALL_SECONDS
from flask_animegan.jobs.records import JobState

#: Long side asked for: the test styles at 32 px cost a few ms a frame.
SIZE = 32
#: Seconds a small job may take on a busy 2-core machine before the test gives up.
DEADLINE = 120


def post_job(client, body: bytes, transport: str = "multipart", environ=None, **params: str):
    """POST ``body`` to the job API. Werkzeug's test client spools a multipart body over
    500 KB into a temporary file it never closes (a ResourceWarning): big files go raw."""
    environ = environ or {}
    if transport == "raw":
        return client.post("/animegan/jobs", query_string=params, data=body,
                           content_type="application/octet-stream", environ_base=environ)
    form = {"image": (io.BytesIO(body), "upload.bin", "application/octet-stream"), **params}
    return client.post("/animegan/jobs", data=form, content_type="multipart/form-data",
                       environ_base=environ)


def wait_for(client, url: str, until=("done", "failed", "cancelled"), deadline=DEADLINE):
    """Poll ``url`` until its state is in ``until``; every answer seen, in order."""
    seen = []
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        response = client.get(url)
        assert response.status_code == 200, response.get_json()
        seen.append(response.get_json())
        if seen[-1]["state"] in until:
            return seen
        time.sleep(0.05)
    raise AssertionError(f"{url} still {seen[-1]['state']} after {deadline} s: {seen[-1]}")


@pytest.fixture(scope="module")
def jobs_app(models_dir, openvino_cache):
    """An app of its own (jobs change its state), on the local queue, caps raised so the
    tests that are not about the caps are not stopped by them."""
    app = build_app(models_dir, openvino_cache, ANIMEGAN_JOBS_PER_CLIENT=50,
                    ANIMEGAN_JOB_MAX_QUEUE=200)
    app.logger.setLevel(logging.CRITICAL)
    return app


@pytest.fixture
def jclient(jobs_app):
    return jobs_app.test_client()


# -- the flow ----------------------------------------------------------------------------
MEDIA = {
    "gif": (lambda: gif_from_photos(12, durations=[60, 120] * 6), "image/gif"),
    "webp": (lambda: webp_animation(8), "image/webp"),
    "apng": (lambda: apng(8), "image/apng"),
    "mp4": (lambda: video_clip(0.8, fps=10, audio=True), "video/mp4"),
    # AV1 with MP3 sound: both decoded by a library of their own (libdav1d, mp3float)
    "av1": (lambda: isolated_clip(seconds=0.8, fps=10, codec="libsvtav1",
                                  audio_codec="libmp3lame"), "video/mp4"),
}


@pytest.mark.parametrize("transport", ["multipart", "raw"])
def test_a_gif_job_goes_from_202_to_its_result(jclient, transport):
    body = gif_from_photos(12, durations=[60, 120] * 6)
    response = post_job(jclient, body, transport, size=str(SIZE))
    assert response.status_code == 202, response.get_json()
    job = response.get_json()
    location = response.headers["Location"]
    assert re.fullmatch(r"/animegan/jobs/[A-Za-z0-9_-]{32}", location)
    assert job["url"] == location and job["state"] in ("queued", "running")
    assert job["frames_total"] == 12 and job["kind"] == "animation" and job["format"] == "GIF"
    assert job["result_url"] is None and response.headers["Cache-Control"] == "no-store"

    seen = wait_for(jclient, location)
    done = seen[-1]
    assert done["state"] == "done", done
    assert done["frames_done"] == done["frames_total"] == 12 and done["progress"] == 1.0
    assert done["eta_s"] is None and done["error"] is None
    # progress only goes forward, and stays within 0..1
    progress = [answer["progress"] for answer in seen]
    assert progress == sorted(progress) and all(0 <= p <= 1 for p in progress)
    assert all(a["frames_done"] <= a["frames_total"] for a in seen)

    result = jclient.get(done["result_url"])
    assert result.status_code == 200 and result.mimetype == "image/gif"
    image = Image.open(io.BytesIO(result.data))
    assert image.n_frames == 12 and max(image.size) <= SIZE
    download = jclient.get(done["download_url"])
    assert download.headers["Content-Disposition"] == (
        f'attachment; filename="anime-{done["style"]}.gif"')
    preview = jclient.get(done["preview_url"])
    assert preview.mimetype == "image/jpeg" and open_image(preview.data).format == "JPEG"


@pytest.mark.parametrize("kind", ["webp", "apng", "mp4", "av1"])
def test_every_kind_of_file_ends_as_the_same_kind(jclient, kind):
    make, mimetype = MEDIA[kind]
    body = make()
    response = post_job(jclient, body, size=str(SIZE))
    assert response.status_code == 202, response.get_json()
    done = wait_for(jclient, response.headers["Location"])[-1]
    assert done["state"] == "done", done
    result = jclient.get(done["result_url"])
    assert result.mimetype == mimetype == done["result_mimetype"]
    if mimetype == "video/mp4":
        decoded = decoded_video(result.data)
        assert decoded["frames"] == done["frames_total"] == 8 and decoded["audio"]
    else:
        assert Image.open(io.BytesIO(result.data)).n_frames == done["frames_total"] == 8


@pytest.mark.parametrize("container", ["avi", "mpeg", "flv"])
@pytest.mark.parametrize("path", ["/animegan/jobs", "/animegan/convert"])
def test_a_video_in_a_container_that_is_not_read_is_415_naming_those_that_are(
        jclient, path, container):
    """Not "the file is not an image": the sender hears which videos are converted."""
    body = video_clip(0.5, fps=10, container=container, audio=False)
    response = jclient.post(path, data={"image": (io.BytesIO(body), "clip.bin")},
                            content_type="multipart/form-data")
    assert response.status_code == 415
    assert re.match(r"\S+ videos are not accepted; .*an MP4, WebM or MOV video",
                    response.get_json()["error"])


def test_progress_is_reported_while_a_job_runs(jclient):
    response = post_job(jclient, gif_from_photos(40), size="64")
    seen = wait_for(jclient, response.headers["Location"])
    running = [a for a in seen if a["state"] == "running"]
    assert seen[-1]["state"] == "done"
    # frames done went up while running, with an ETA once a frame had been timed
    assert len({a["frames_done"] for a in running}) >= 2, [a["frames_done"] for a in seen]
    assert any(a["eta_s"] is not None and a["eta_s"] >= 0 for a in running)


def test_the_page_refreshes_itself_until_the_result_shows(jclient):
    response = post_job(jclient, gif_from_photos(10), size=str(SIZE))
    job = response.get_json()
    page = jclient.get(job["page_url"])
    text = page.get_data(as_text=True)
    assert page.status_code == 200 and page.headers["Cache-Control"] == "private, no-store"
    if job["state"] != "done":
        assert '<meta http-equiv="refresh" content="2">' in text and "<progress" in text
    wait_for(jclient, job["url"])
    done = jclient.get(job["page_url"])
    text = done.get_data(as_text=True)
    assert "http-equiv=\"refresh\"" not in text and "Refresh" not in done.headers
    assert f'src="{job["url"]}/result"' in text and f'download="anime-{job["style"]}.gif"' in text


# -- cancel and unknown ids ----------------------------------------------------------------
def test_a_queued_job_is_cancelled_at_once_and_a_running_one_soon(jclient):
    long_job = post_job(jclient, gif_from_photos(300), "raw", size="64").get_json()
    queued = post_job(jclient, gif_from_photos(10), size=str(SIZE)).get_json()
    wait_for(jclient, long_job["url"], until=("running", "done"))
    response = jclient.delete(queued["url"])
    assert response.status_code == 200 and response.get_json()["state"] == "cancelled"
    assert jclient.delete(queued["url"]).status_code == 200  # again: the same answer

    response = jclient.delete(long_job["url"])
    assert response.status_code in (200, 202), response.get_json()
    ended = wait_for(jclient, long_job["url"], deadline=30)[-1]
    assert ended["state"] == "cancelled" and ended["frames_done"] < 300, ended
    for part in ("result", "preview"):
        refused = jclient.get(f"{queued['url']}/{part}")
        assert refused.status_code == 409 and "cancelled" in refused.get_json()["error"]


def test_a_finished_job_cannot_be_cancelled(jclient):
    job = post_job(jclient, gif_from_photos(4), size=str(SIZE)).get_json()
    assert wait_for(jclient, job["url"])[-1]["state"] == "done"
    response = jclient.delete(job["url"])
    assert response.status_code == 409 and "already ended" in response.get_json()["error"]


@pytest.mark.parametrize("path", ["", "/result", "/preview"])
@pytest.mark.parametrize("job_id", ["A" * 32, "nope", "../../etc", "a" * 200, "%00"])
def test_an_unknown_job_is_404_in_json(jclient, job_id, path):
    response = jclient.get(f"/animegan/jobs/{job_id}{path}")
    assert response.status_code == 404 and response.is_json, response.data[:200]
    if "/" not in job_id:  # the others match no route: the blueprint's generic 404
        assert "expired or never existed" in response.get_json()["error"]
    if not path:
        deleted = jclient.delete(f"/animegan/jobs/{job_id}")
        assert deleted.status_code == 404 and deleted.is_json


def test_an_unknown_job_page_is_404_as_a_page(jclient):
    response = jclient.get(f"/animegan/jobs/{'B' * 32}/page")
    assert response.status_code == 404 and response.mimetype == "text/html"
    assert "expired or never existed" in response.get_data(as_text=True)


# -- the pointers between /convert and /jobs --------------------------------------------
@pytest.mark.parametrize("kind", sorted(MEDIA))
def test_convert_points_an_animation_or_a_video_to_jobs(jclient, kind):
    body = MEDIA[kind][0]()
    response = jclient.post("/animegan/convert", data=body, content_type="image/jpeg")
    assert response.status_code == 415, response.data[:200]
    answer = response.get_json()
    assert answer["jobs_url"] == "/animegan/jobs" and "POST /animegan/jobs" in answer["error"]


def test_a_one_frame_gif_is_still_a_photo(jclient):
    still = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 90, 30)).save(still, "GIF")
    assert jclient.post("/animegan/convert", data=still.getvalue(),
                        content_type="image/gif").status_code == 200
    response = post_job(jclient, still.getvalue())
    assert response.status_code == 415
    assert response.get_json()["convert_url"] == "/animegan/convert"


def test_a_still_photo_sent_to_jobs_points_to_convert(jclient):
    jpeg = io.BytesIO()
    Image.new("RGB", (40, 30), (20, 90, 130)).save(jpeg, "JPEG")
    response = post_job(jclient, jpeg.getvalue(), "raw")
    assert response.status_code == 415 and "still photo" in response.get_json()["error"]


def test_the_form_turns_an_animation_into_a_job_page(jclient):
    form = {"image": (io.BytesIO(gif_from_photos(6)), "cat.gif", "image/gif"),
            "size": str(SIZE)}
    response = jclient.post("/animegan/upload", data=form, content_type="multipart/form-data")
    assert response.status_code == 303, response.data[:300]
    page_url = response.headers["Location"]
    assert re.fullmatch(r"/animegan/jobs/[A-Za-z0-9_-]{32}/page", page_url)
    wait_for(jclient, page_url.removesuffix("/page"))
    page = jclient.get(page_url).get_data(as_text=True)
    assert "Your anime animation" in page and "Download" in page


def test_bad_parameters_are_refused_before_the_probe(jclient):
    body = gif_from_photos(4)
    for params, word in (({"size": "9999"}, "size"), ({"style": "nope"}, "nope"),
                         ({"format": "tiff"}, "format")):
        response = post_job(jclient, body, **params)
        assert response.status_code in (400, 404) and word in response.get_json()["error"]


# -- the limits at the door ------------------------------------------------------------------
def test_unfinished_jobs_per_client_are_capped(make_app):
    client = make_app(ANIMEGAN_JOBS_PER_CLIENT=1).test_client()
    first = post_job(client, gif_from_photos(200), "raw", size="64")
    assert first.status_code == 202
    second = post_job(client, gif_from_photos(4), size=str(SIZE))
    assert second.status_code == 429 and second.headers["Retry-After"]
    assert "1 unfinished job" in second.get_json()["error"]
    assert "DELETE" in second.get_json()["error"]
    # through the form, on the page: no DELETE to send there, so none is suggested
    form = {"image": (io.BytesIO(gif_from_photos(4)), "cat.gif", "image/gif")}
    page = client.post("/animegan/upload", data=form, content_type="multipart/form-data")
    assert page.status_code == 429 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert "1 unfinished job" in text and "wait for one to finish" in text.lower()
    assert "DELETE" not in text
    # another client is not counted with this one
    other = post_job(client, gif_from_photos(4), environ={"REMOTE_ADDR": "127.0.0.77"},
                     size=str(SIZE))
    assert other.status_code == 202
    client.delete(first.headers["Location"])
    wait_for(client, first.headers["Location"], deadline=30)
    assert post_job(client, gif_from_photos(4), size=str(SIZE)).status_code == 202


def test_a_client_whose_worker_died_is_not_refused_for_it(make_app):
    """A job whose run stalled a second time (its workers killed) is settled when the
    client's jobs are counted: failed, so it does not hold the client's one job."""
    app = make_app(ANIMEGAN_JOBS_PER_CLIENT=1)
    jobs = app.extensions["animegan"].jobs
    address = "127.0.0.88"
    data = gif_from_photos(4)
    info = jobs.probe(data)
    record = jobs.store.create(data, client=address, style="test_style", size=SIZE,
                               kind=info.kind, format=info.format, frames_total=info.frames)
    record.state, record.attempts, record.lost_runs = JobState.RUNNING, 2, 1
    record.updated_at = time.time() - JOB_STALL_SECONDS - 1
    jobs.store.start(record)
    client = app.test_client()
    response = post_job(client, data, environ={"REMOTE_ADDR": address}, size=str(SIZE))
    assert response.status_code == 202, response.get_json()
    stalled = client.get(f"/animegan/jobs/{record.id}").get_json()
    assert stalled["state"] == "failed" and "stopped" in stalled["error"]


def test_a_job_counts_against_the_rate_limit_by_its_frames(make_app, monkeypatch):
    monkeypatch.setattr("flask_animegan.web.uploads.FRAMES_PER_CONVERSION", 5)
    monkeypatch.setattr("flask_animegan.convert.costs.FRAMES_PER_CONVERSION", 5)
    client = make_app(ANIMEGAN_RATE_LIMIT="5 per minute",
                      ANIMEGAN_JOBS_PER_CLIENT=10).test_client()
    response = post_job(client, gif_from_photos(12), size=str(SIZE))  # 3 conversions
    assert response.status_code == 202 and response.headers["X-RateLimit-Remaining"] == "2"
    refused = post_job(client, gif_from_photos(12), size=str(SIZE))  # 3 more: 1 left after
    assert refused.status_code == 429 and refused.headers["Retry-After"]
    assert "12 frames count as 3 conversions" in refused.get_json()["error"]
    # the refusal cost nothing: two conversions are left (two photos: two misses)
    statuses = [client.post("/animegan/convert", data=data, content_type="image/jpeg",
                            query_string={"size": str(SIZE)}).status_code
                for data in (photo_bytes("coffee"), photo_bytes("rocket"), _jpeg())]
    assert statuses == [200, 200, 429]


def test_a_file_longer_than_the_whole_rate_limit_says_so(make_app, monkeypatch):
    monkeypatch.setattr("flask_animegan.web.uploads.FRAMES_PER_CONVERSION", 2)
    monkeypatch.setattr("flask_animegan.convert.costs.FRAMES_PER_CONVERSION", 2)
    client = make_app(ANIMEGAN_RATE_LIMIT="3 per minute").test_client()
    response = post_job(client, gif_from_photos(10), size=str(SIZE))  # 5 > 3
    assert response.status_code == 429 and "send a shorter clip" in response.get_json()["error"]


def test_a_full_queue_answers_503_with_retry_after(make_app):
    client_app = make_app(ANIMEGAN_JOB_MAX_QUEUE=1, ANIMEGAN_JOBS_PER_CLIENT=10)
    client = client_app.test_client()
    running = post_job(client, gif_from_photos(300), "raw", size="64")
    wait_for(client, running.headers["Location"], until=("running", "done"))
    waiting = post_job(client, gif_from_photos(4), size=str(SIZE))
    assert waiting.status_code == 202
    full = post_job(client, gif_from_photos(4), size=str(SIZE))
    assert full.status_code == 503 and int(full.headers["Retry-After"]) > 0
    assert "queue is full" in full.get_json()["error"]
    for job in (waiting, running):
        client.delete(job.headers["Location"])


def test_a_file_over_the_job_limits_is_refused_at_the_door(make_app):
    client = make_app(ANIMEGAN_MAX_FRAMES=10, ANIMEGAN_MAX_SECONDS=2).test_client()
    for body in (gif_from_photos(11), gif_from_photos(8, durations=400),
                 video_clip(1.5, fps=10, audio=False)):
        for response in (post_job(client, body),
                         client.post("/animegan/convert", data=body,
                                     content_type="application/octet-stream")):
            assert response.status_code == 413, response.get_json()
            assert response.get_json()["error"]


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 32), (120, 60, 200)).save(buffer, "JPEG")
    return buffer.getvalue()


# -- corrupt files: a job or a clear refusal, never a 5xx -------------------------------
#: The small valid file each class is made from.
CORRUPT_BASES = {
    "gif": lambda: gif_from_photos(4, size=(48, 32)),
    "webp": lambda: webp_animation(4, size=(48, 32)),
    "apng": lambda: apng(4, size=(48, 32)),
    "mp4": lambda: video_clip(0.4, fps=10, size=(48, 32), audio=True),
}
TRANSPORTS = ("jobs_multipart", "jobs_raw", "form", "convert_raw")
_INLINE_ERROR = re.compile(r'<p id="animegan-error"([^>]*)>([^<]*)</p>')


def _variants(base: bytes, seed: int) -> list[tuple[str, bytes]]:
    cut = [(f"prefix {n}", body) for n, body in prefixes(base, seed)]
    return cut + [(f"flip {name}", body) for name, body in bit_flips(base, seed, 40)]


def _send(client, transport: str, body: bytes):
    if transport == "convert_raw":
        return client.post("/animegan/convert", query_string={"size": "16"}, data=body,
                           content_type="application/octet-stream")
    if transport == "form":
        form = {"image": (io.BytesIO(body), "upload.bin", "application/octet-stream"),
                "size": "16"}
        return client.post("/animegan/upload", data=form, content_type="multipart/form-data")
    return post_job(client, body, "raw" if transport == "jobs_raw" else "multipart", size="16")


def _violation(response, transport: str) -> str | None:
    """None when the answer keeps the contract: a job (202 + Location; the form: 303 to
    a job page, or to a result page when the decoder read it as a still) or a refusal
    (400, 413, 415) that says why, in JSON or inline on the form."""
    status = response.status_code
    if transport == "convert_raw":  # a still (a file cut to its first frame) or a pointer
        if status == 200:
            return None if response.mimetype.startswith("image/") else "200, not an image"
        payload = response.get_json(silent=True) or {}
        if status == 415 and "is an animated" in str(payload.get("error")) or (
                status == 415 and "a video" in str(payload.get("error"))):
            return None if payload.get("jobs_url") == "/animegan/jobs" else "415 without jobs_url"
    if transport == "form":
        if status == 303:
            location = response.headers.get("Location", "")
            ok = re.fullmatch(r"/animegan/(jobs/[\w-]{32}/page|result/[\w-]+)", location)
            return None if ok else f"303 to {location!r}"
        if status in (400, 413, 415):
            match = _INLINE_ERROR.search(response.get_data(as_text=True))
            return None if match and match.group(2).strip() else f"{status} without a message"
        return f"HTTP {status}"
    if status == 202:
        return None if "Location" in response.headers else "202 without Location"
    if status in (400, 413, 415):
        payload = response.get_json(silent=True) or {}
        return None if str(payload.get("error", "")).strip() else f"{status} without JSON error"
    return f"HTTP {status}"


@pytest.fixture(scope="module")
def storm(models_dir, openvino_cache):
    app = build_app(models_dir, openvino_cache, ANIMEGAN_JOBS_PER_CLIENT=1000,
                    ANIMEGAN_JOB_MAX_QUEUE=100000, ANIMEGAN_CACHE_TTL=0,
                    ANIMEGAN_DECODE_ISOLATION="process")
    app.logger.setLevel(logging.CRITICAL)
    escaped: list[BaseException] = []

    def record(sender, exception, **extra):
        escaped.append(exception)

    got_request_exception.connect(record, app)
    yield app, escaped
    got_request_exception.disconnect(record, app)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("kind", sorted(CORRUPT_BASES))
def test_corrupt_files_get_a_job_or_a_clear_refusal(storm, kind, transport):
    app, escaped = storm
    client = app.test_client()
    counts: dict[str, Counter] = defaultdict(Counter)
    offenders = []
    for name, body in _variants(CORRUPT_BASES[kind](), seed=sum(map(ord, kind))):
        escaped.clear()
        response = _send(client, transport, body)
        counts[name.split()[0]][response.status_code] += 1
        problem = _violation(response, transport)
        if problem:
            if escaped:
                problem += f" ({escaped[-1].__class__.__name__}: {str(escaped[-1])[:80]})"
            offenders.append(f"{name}: {problem}")
        location = response.headers.get("Location", "")
        if "/jobs/" in location:  # accepted: cancel it, so the worker skips it
            client.delete(location.removesuffix("/page"))
    summary = {cls: dict(sorted(c.items())) for cls, c in counts.items()}
    assert not offenders, f"{kind} via {transport}: {summary}\n" + "\n".join(offenders[:8])
    if transport != "convert_raw":  # the flips keep some files whole enough for a job
        assert sum(c[202] + c[303] for c in counts.values()) >= 1, summary


#: What a job says when something unexpected broke it (jobs/work.py's INTERNAL).
GENERIC_FAILURE = "the conversion failed on the server"


@pytest.mark.parametrize("kind", sorted(CORRUPT_BASES))
def test_corrupt_files_that_pass_the_door_end_done_or_failed_clearly(jclient, kind):
    """Files whose headers are whole but whose frames are cut or flipped: the probe lets
    them in, and the job ends (never stuck) done, or failed with a message that says why,
    never the generic one of an unexpected error."""
    base = CORRUPT_BASES[kind]()
    seed = sum(map(ord, kind)) + 1
    bodies = [(f"cut at {n}", base[:n]) for n in (len(base) // 2, len(base) * 3 // 4,
                                                   len(base) - 1)]
    bodies += [(f"flip {name}", body) for name, body in bit_flips(base, seed, 12)]
    ended = Counter()
    for name, body in bodies:
        response = post_job(jclient, body, "raw", size="16")
        if response.status_code != 202:
            assert response.status_code in (400, 413, 415), (name, response.status_code)
            ended["refused"] += 1
            continue
        job = wait_for(jclient, response.headers["Location"])[-1]
        assert job["state"] in ("done", "failed"), (name, job)
        if job["state"] == "failed":
            assert job["error"] and GENERIC_FAILURE not in job["error"], (name, job["error"])
        ended[job["state"]] += 1
    print(f"{kind}: {dict(ended)}")
    assert ended["done"] + ended["failed"] >= 1, ended


def test_video_without_audio_and_webm_are_jobs_too(jclient):
    for body in (video_clip(0.5, fps=10, audio=False),
                 video_clip(0.5, fps=10, container="webm", audio=True)):
        response = post_job(jclient, body, size=str(SIZE))
        assert response.status_code == 202, response.get_json()
        done = wait_for(jclient, response.headers["Location"])[-1]
        assert done["state"] == "done", done
        with av.open(io.BytesIO(jclient.get(done["result_url"]).data)) as container:
            assert container.streams.video[0].codec_context.name == "h264"


def test_the_job_api_is_exempt_from_the_sites_csrf_check_and_the_form_is_not(
        models_dir, openvino_cache):
    from flask_wtf.csrf import CSRFProtect

    app = build_app(models_dir, openvino_cache, SECRET_KEY="a site's secret")
    CSRFProtect(app)  # made after AnimeGAN(app), as a site may
    client = app.test_client()
    created = post_job(client, gif_from_photos(4), size=str(SIZE))
    assert created.status_code == 202, created.get_json()
    cancelled = client.delete(created.headers["Location"])
    assert cancelled.status_code in (200, 202, 409), cancelled.get_json()
    form = {"image": (io.BytesIO(gif_from_photos(4)), "cat.gif", "image/gif")}
    refused = client.post("/animegan/upload", data=form, content_type="multipart/form-data")
    assert refused.status_code == 400 and "reload the page" in refused.get_data(as_text=True)
