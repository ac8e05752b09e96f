"""Video jobs in segments: a run resumes at the first segment missing and writes what an
uninterrupted run writes; the part converted so far plays at ``partial_url`` (API, page).
On the in-process queue with the seeded test model; the real RQ workers killed mid-job are
in test_job_resume.py."""

from __future__ import annotations

import io
import time

import av
import numpy as np
import pytest
from media import gif_from_photos, video_clip
from test_jobs_core import follow, stalled_copy, submit

from flask_animegan.convert.request import ConvertRequest, Options
from flask_animegan.jobs.records import JobState
from flask_animegan.outputs.segments import SEGMENT_SECONDS, Segment, segment_frames


def frames_and_audio(data: bytes) -> tuple[list[np.ndarray], list[float], float | None]:
    """A video's pictures, their times, and its audio's end (None: no audio)."""
    with av.open(io.BytesIO(data)) as container:
        pictures, times = [], []
        for frame in container.decode(container.streams.video[0]):
            pictures.append(frame.to_ndarray(format="rgb24"))
            times.append(round(float(frame.time), 4))
        end = None
        if container.streams.audio:
            container.seek(0)
            for frame in container.decode(container.streams.audio[0]):
                end = float(frame.time) + frame.samples / frame.sample_rate
    return pictures, times, end


def request_for(service, size: int = 96) -> ConvertRequest:
    return ConvertRequest(service.engine.style("test_style"), size, "jpeg", Options())


# -- the rule ---------------------------------------------------------------------------
@pytest.mark.parametrize(("fps", "per"), [(10, 20), (25, 50), (30000 / 1001, 60), (60, 120),
                                          (0.5, 1)])
def test_a_segment_holds_two_seconds_of_video(service, fps, per):
    info = service.jobs.probe(video_clip(1.0, fps, audio=False))
    assert info.fps == pytest.approx(fps, rel=1e-3)
    assert segment_frames(info) == per == max(1, round(fps * SEGMENT_SECONDS))


def test_an_animation_is_one_segment(service):
    info = service.jobs.probe(gif_from_photos(30))
    assert segment_frames(info) == 30


def test_a_segment_survives_its_storage():
    segment = Segment(3, 60, 20, 4, 6.0, 8.0, b"\x00mp4 bytes\xff", stopped="why")
    assert Segment.from_bytes(segment.to_bytes()) == segment
    for broken in (b"", b"\x00\x00", segment.to_bytes()[:9], b"\xff" * 40):
        assert Segment.from_bytes(broken) is None


@pytest.fixture
def service(make_app):
    return make_app().extensions["animegan"]


# -- resuming writes what an uninterrupted run writes -------------------------------------
@pytest.mark.parametrize("static", [0.0, 3.0], ids=["moving", "held-across-a-start"])
def test_a_resumed_conversion_writes_the_same_segments(service, static):
    """From any segment on, the segments are byte for byte an uninterrupted run's: a
    repeat is never reused across a segment's start (a held shot that spans one is
    converted again there), so nothing carries over from before the start."""
    source = video_clip(5.0, 10, static_seconds=static)
    info = service.jobs.probe(source)
    converter, request = service.converter, request_for(service)
    whole = list(converter.segments(source, info, request))
    assert [s.frames for s in whole] == [20, 20, 10]
    assert [s.start for s in whole] == [0, 20, 40] and whole[0].preview
    if static:
        assert whole[0].reused > 0 and whole[1].reused > 0  # the shot held across 2 s
    for start in (1, 2):
        resumed = list(converter.segments(source, info, request, start=start))
        assert [(s.index, s.start, s.frames, s.reused, s.start_s, s.end_s, s.data)
                for s in resumed] == [(s.index, s.start, s.frames, s.reused, s.start_s,
                                       s.end_s, s.data) for s in whole[start:]]
        assert not resumed[0].preview  # the preview is the first segment's


@pytest.mark.parametrize(("container", "fps", "seconds"),
                         [("mp4", 25, 4.5), ("webm", 30000 / 1001, 2.5), ("mov", 12, 1.0)])
def test_the_joined_segments_hold_every_frame_at_its_time_and_the_audio(
        service, container, fps, seconds):
    source = video_clip(seconds, fps, container=container)
    info = service.jobs.probe(source)
    result = service.converter.media(source, info, request_for(service))
    pictures, times, audio_end = frames_and_audio(result.data)
    _, source_times, source_audio = frames_and_audio(source)
    assert len(pictures) == len(source_times)  # (a WebM header only estimates a count)
    assert max(abs(a - b) for a, b in zip(times, source_times)) < 0.5 / fps
    assert audio_end == pytest.approx(source_audio, abs=0.05)


# -- a job resumes at its first segment missing --------------------------------------------
def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if error == 0 else 10 * np.log10(255 ** 2 / error)


def test_a_job_whose_run_died_resumes_at_its_first_segment_missing(service):
    """A running job with two segments kept whose worker stopped reporting: the sweep
    queues it again, the next run starts at frame 40 (progress never back to 0) and the
    result is an uninterrupted job's, frame for frame and in its audio."""
    source = video_clip(6.0, 10)
    done = follow(service, submit(service, source).id, lambda r: r.finished)[-1]
    assert done.state == JobState.DONE and done.segments_done == 3, done
    whole = service.jobs.store.get_result(done.id)

    record = stalled_copy(service, source, attempts=1)
    info = service.jobs.probe(source)
    kept = list(service.converter.segments(source, info, request_for(service)))[:2]
    for segment in kept:
        assert service.jobs.store.put_segment(record.id, segment)
    service.jobs.store.put_audio(record.id, *service.converter.audio(source, info))
    record.segment_frames, record.segments_done, record.frames_done = 20, 2, 47
    record.segments_reused = sum(s.reused for s in kept)
    service.jobs.store.update(record)
    seen = follow(service, record.id, lambda r: r.finished)
    final = seen[-1]
    assert final.state == JobState.DONE and final.attempts == 2, final
    assert final.lost_runs == 0  # its run had finished segments: no fault of the job's
    assert min(r.frames_done for r in seen) >= 40
    assert final.frames_done == final.frames_total == 60
    resumed = service.jobs.store.get_result(record.id)
    (a, a_times, a_end), (b, b_times, b_end) = frames_and_audio(whole), frames_and_audio(resumed)
    assert len(a) == len(b) == 60 and a_times == b_times
    assert min(psnr(x, y) for x, y in zip(a, b)) >= 40
    assert a_end == pytest.approx(b_end, abs=0.05)
    for index in range(3):  # the parts go with the job's end
        assert not service.jobs.store.storage.get(f"job:{record.id}:segment:{index}")
    assert not service.jobs.store.storage.get(f"job:{record.id}:audio")


@pytest.mark.parametrize(("finished_one", "state"), [(True, JobState.DONE),
                                                     (False, JobState.FAILED)])
def test_only_a_run_lost_before_its_first_segment_counts_against_the_job(
        service, finished_one, state):
    """A job lost one run already: its next lost run fails it, unless that run had
    finished a segment (a deploy or a killed machine, not a file that kills workers)."""
    source = video_clip(5.0, 10, audio=False)
    record = stalled_copy(service, source, attempts=2)
    assert record.lost_runs == 1
    record.segment_frames, record.run_from = 20, 0
    if finished_one:
        info = service.jobs.probe(source)
        first = next(service.converter.segments(source, info, request_for(service)))
        service.jobs.store.put_segment(record.id, first)
        record.segments_done, record.frames_done = 1, 20
    service.jobs.store.update(record)
    final = follow(service, record.id, lambda r: r.finished)[-1]
    assert final.state == state, final
    if finished_one:
        assert final.frames_done == 50 and final.lost_runs == 1


# -- the part converted so far --------------------------------------------------------------
def running_with(service, source: bytes, segments: int):
    """A running job (its worker busy elsewhere: a fresh report) with ``segments`` kept."""
    record = stalled_copy(service, source, attempts=1, reported=time.time() + 3600)
    info = service.jobs.probe(source)
    for segment in list(service.converter.segments(source, info, request_for(service))
                        )[:segments]:
        assert service.jobs.store.put_segment(record.id, segment)
    service.jobs.store.put_audio(record.id, *service.converter.audio(source, info))
    record.segment_frames, record.segments_done = segment_frames(info), segments
    record.frames_done = segments * record.segment_frames
    service.jobs.store.update(record)
    return record


def test_the_part_converted_so_far_plays_with_its_audio(make_app):
    app = make_app()
    service, client = app.extensions["animegan"], app.test_client()
    source = video_clip(6.0, 10)
    record = running_with(service, source, 2)
    job = client.get(f"/animegan/jobs/{record.id}").get_json()
    assert job["segments_done"] == 2 and job["segments_total"] == 3
    assert job["partial_url"] == f"/animegan/jobs/{record.id}/partial?segments=2"
    for asked, frames in ((1, 20), (2, 40), (None, 40), (9, 40)):
        url = f"/animegan/jobs/{record.id}/partial" + (f"?segments={asked}" if asked else "")
        response = client.get(url)
        assert response.status_code == 200 and response.mimetype == "video/mp4"
        assert response.headers["Accept-Ranges"] == "bytes"
        pictures, times, audio_end = frames_and_audio(response.data)
        assert len(pictures) == frames and times[0] == 0.0
        assert audio_end == pytest.approx(frames / 10, abs=0.05)  # it ends with its frames
    for bad in ("0", "-1", "two", "1.5", ""):
        refused = client.get(f"/animegan/jobs/{record.id}/partial?segments={bad}")
        assert refused.status_code == 400 and "whole number" in refused.get_json()["error"]
    assert client.get(f"/animegan/jobs/{record.id}/partial?segments=1&segments=2"
                      ).status_code == 400
    ranged = client.get(job["partial_url"], headers={"Range": "bytes=0-99"})
    assert ranged.status_code == 206 and len(ranged.data) == 100

    page = client.get(job["page_url"])
    text = page.get_data(as_text=True)
    assert 'id="animegan-job-partial"' in text and job["partial_url"].replace(
        "&", "&amp;") in text
    assert "Refresh" not in page.headers  # the script polls: a refresh restarts the video
    assert '<noscript><meta http-equiv="refresh"' in text


def test_nothing_plays_before_the_first_segment_or_for_other_jobs(make_app):
    app = make_app()
    service, client = app.extensions["animegan"], app.test_client()
    source = video_clip(3.0, 10, audio=False)
    record = running_with(service, source, 0)
    job = client.get(f"/animegan/jobs/{record.id}").get_json()
    assert job["partial_url"] is None and job["segments_done"] == 0
    refused = client.get(f"/animegan/jobs/{record.id}/partial",
                         headers={"Accept": "application/json"})
    assert refused.status_code == 409 and "partial_url" in refused.get_json()["error"]
    page = client.get(job["page_url"])
    assert page.headers["Refresh"] == "2" and "animegan-job-partial" not in page.get_data(
        as_text=True)
    assert client.get("/animegan/jobs/" + "x" * 32 + "/partial").status_code == 404

    gif = follow(service, submit(service, gif_from_photos(6)).id, lambda r: r.finished)[-1]
    assert client.get(f"/animegan/jobs/{gif.id}").get_json()["partial_url"] is None
    video = follow(service, submit(service, source).id, lambda r: r.finished)[-1]
    assert video.state == JobState.DONE
    done = client.get(f"/animegan/jobs/{video.id}/partial?segments=1")
    assert done.status_code == 303 and done.headers["Location"].endswith(
        f"/jobs/{video.id}/result")
    assert client.get(f"/animegan/jobs/{video.id}").get_json()["partial_url"] is None


@pytest.mark.parametrize(("seconds", "said"), [(300, "5 minutes"), (30, "30 seconds"),
                                               (7200, "2 hours")])
def test_the_form_says_how_long_a_video_may_be(make_app, seconds, said):
    page = make_app(ANIMEGAN_MAX_SECONDS=seconds).test_client().get("/animegan/")
    assert f"videos up to {said} are converted" in " ".join(page.get_data(as_text=True).split())
