"""The jobs core through the service, on the in-process queue (the embedded default):
records, the worker thread, progress, frame reuse, cancel, a full queue, stalls.

The views (POST /jobs ...) have their own tests (test_jobs_api.py); these call
``service.jobs`` as the views do, with generated media (tests/media.py).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
from media import camera_move, gif_from_photos, video_clip
from PIL import Image

from flask_animegan.errors import ConversionError, Overloaded
from flask_animegan.convert import repeats
from flask_animegan.jobs.records import JobRecord, JobState
from flask_animegan.jobs import work
from flask_animegan.jobs.work import INTERNAL, STALLED

CLIENT = "127.0.0.1"


def submit(service, data: bytes, client: str = CLIENT, size: int = 96) -> JobRecord:
    info = service.jobs.probe(data)
    return service.jobs.submit(data, info, style="test_style", size=size, client=client)


def follow(service, job_id: str, until, timeout: float = 120.0) -> list[JobRecord]:
    """Every record read every 20 ms until ``until(record)`` (or a timeout: fails)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.jobs.get(job_id)
        assert record is not None
        seen.append(record)
        if until(record):
            return seen
        time.sleep(0.02)
    pytest.fail(f"job {job_id} still {seen[-1].state} after {timeout} s: {seen[-1]}")


def finished(record: JobRecord) -> bool:
    return record.finished


@pytest.fixture
def service(make_app):
    return make_app().extensions["animegan"]


def test_without_redis_jobs_run_in_process(service):
    assert service.jobs.queue.kind == "local"
    assert service.health()["jobs"]["kind"] == "local"


def test_a_gif_goes_queued_running_done_with_rising_progress(service):
    data = gif_from_photos(20, size=(128, 96), durations=[40 + 10 * (i % 3) for i in range(20)])
    record = submit(service, data, size=128)
    assert record.state == JobState.QUEUED and record.frames_total == 20
    assert CLIENT not in record.to_bytes().decode()  # a digest, never the address

    seen = follow(service, record.id, finished)
    states = [r.state for r in seen]
    assert states[-1] == JobState.DONE, seen[-1].error
    assert JobState.RUNNING in states
    assert states.index(JobState.RUNNING) < states.index(JobState.DONE)
    done = [r.frames_done for r in seen]
    assert done == sorted(done), "frames_done never goes back"
    assert any(0 < d < 20 for d in done), f"no progress between start and end: {set(done)}"
    assert any(r.eta_s is not None and r.eta_s > 0 for r in seen if r.state == JobState.RUNNING)
    final = seen[-1]
    assert final.frames_done == 20 and final.progress == 1.0 and final.eta_s == 0.0
    assert final.result_mimetype == "image/gif"

    result = service.jobs.store.get_result(record.id)
    with Image.open(io.BytesIO(result)) as gif:
        assert gif.n_frames == 20
        assert max(gif.size) == 128
        durations = []
        for index in range(gif.n_frames):
            gif.seek(index)
            durations.append(gif.info["duration"])
    assert durations == [40 + 10 * (i % 3) for i in range(20)]
    with Image.open(io.BytesIO(service.jobs.store.get_preview(record.id))) as still:
        assert still.format == "JPEG"
    assert service.jobs.store.get_input(record.id) is None, "the upload is dropped at the end"


def held_shot_gif(held: int, moving: int) -> tuple[bytes, int]:
    """A GIF of a shot held for ``held`` frames, then ``moving`` frames of a pan. The held
    frames share their pixels; each moves one palette colour by a level, so that Pillow's
    writer (which merges identical frames) keeps them apart."""
    still = next(camera_move(1, (96, 64))).quantize(255)
    frames = []
    for index in range(held):
        frame = still.copy()
        palette = still.getpalette()
        palette[3 * index] ^= 1
        frame.putpalette(palette)
        frames.append(frame)
    frames += [frame.quantize(255) for frame in list(camera_move(moving + 1, (96, 64)))[1:]]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=80,
                   loop=0, optimize=False)
    return buffer.getvalue(), held + moving


def test_a_held_shot_is_converted_once(service):
    """A frame that is the same photo as the last converted one (the cache's rule) reuses
    its result; the frames of a pan are each converted."""
    data, count = held_shot_gif(held=8, moving=6)
    record = submit(service, data)
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.DONE, final.error
    assert final.frames_done == count
    assert final.frames_reused == 7, final  # the held shot's first frame is converted
    with Image.open(io.BytesIO(service.jobs.store.get_result(record.id))) as gif:
        assert gif.n_frames == count


def test_a_video_is_converted_to_mp4_with_every_frame(service):
    data = video_clip(seconds=2.0, fps=10, size=(96, 64), audio=False, static_seconds=1.0)
    record = submit(service, data)
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.DONE, final.error
    assert final.frames_done == 20 and final.result_mimetype == "video/mp4"
    # the static second's first frame is converted, the other nine reuse it (convert/repeats.py,
    # though H.264 refines the still picture frame by frame); the pan is converted
    assert 8 <= final.frames_reused <= 10, final
    with av.open(io.BytesIO(service.jobs.store.get_result(record.id))) as out:
        assert sum(1 for _ in out.decode(video=0)) == 20


def test_cancel_a_running_job_and_a_queued_one(service):
    long = gif_from_photos(60, size=(128, 96))
    first = submit(service, long, size=128)
    follow(service, first.id, lambda r: r.state == JobState.RUNNING and r.frames_done > 0)
    second = submit(service, long, client="127.0.0.2", size=128)
    assert service.jobs.get(second.id).state == JobState.QUEUED

    cancelled = service.jobs.cancel(second.id)
    assert cancelled.state == JobState.CANCELLED  # a queued job ends at once
    running = service.jobs.cancel(first.id)
    assert running.cancel_requested
    final = follow(service, first.id, finished, timeout=30)[-1]
    assert final.state == JobState.CANCELLED and final.frames_done < 60
    assert service.jobs.store.get_result(first.id) is None
    assert service.jobs.store.get_input(first.id) is None
    # the worker skipped the cancelled one: it stays cancelled, with nothing done
    time.sleep(0.5)
    assert service.jobs.get(second.id).state == JobState.CANCELLED
    assert service.jobs.get(second.id).frames_done == 0
    assert service.jobs.cancel(first.id).state == JobState.CANCELLED  # again: no change


def test_stopping_the_process_stops_its_running_job_at_a_frame(make_app):
    """What the queue does at exit (atexit): the running job stops at its next frame and is
    left running, for the stall rule, as a stopped worker's; a queued one is not started."""
    service = make_app().extensions["animegan"]
    first = submit(service, gif_from_photos(80, size=(128, 96)), size=128)
    follow(service, first.id, lambda r: r.state == JobState.RUNNING and r.frames_done > 0)
    second = submit(service, gif_from_photos(4), client="127.0.0.2", size=128)
    started = time.monotonic()
    service.jobs.queue.stop()
    assert time.monotonic() - started < service.jobs.queue.STOP_WAIT
    assert service.jobs.queue.running is None
    left = service.jobs.get(first.id)
    assert left.state == JobState.RUNNING and 0 < left.frames_done < 80
    time.sleep(0.5)
    assert service.jobs.get(first.id).frames_done == left.frames_done  # nothing runs it
    assert service.jobs.get(second.id).state == JobState.QUEUED


EXITS_MID_JOB = """
import sys, time
from flask import Flask
from flask_animegan import AnimeGAN
from media import gif_from_photos
app = Flask("exits")
app.config.update(ANIMEGAN_MODELS_DIR=sys.argv[1], ANIMEGAN_WARMUP_SIZE=0, ANIMEGAN_CSRF=False,
                  ANIMEGAN_RATE_LIMIT="", ANIMEGAN_BACKEND="torch", ANIMEGAN_PRECISION="fp32",
                  ANIMEGAN_SHIPPED_STYLES=False)
AnimeGAN(app)
client = app.test_client()
url = client.post("/animegan/jobs", data=gif_from_photos(300), query_string={"size": "128"},
                  content_type="image/gif").headers["Location"]
deadline = time.monotonic() + 60
while client.get(url).get_json()["frames_done"] < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print("exiting at", client.get(url).get_json()["frames_done"], "frames", flush=True)
"""


@pytest.mark.slow  # three fresh interpreters with torch: about 17 s
def test_a_process_that_exits_mid_job_exits_cleanly(models_dir, tmp_path):
    """Without the stop at exit, the interpreter tore the network's threads down under the
    job's thread: "terminate called without an active exception", SIGABRT (3 exits in 4
    here). Each run has its own chance, so three."""
    script = tmp_path / "exits.py"
    script.write_text(EXITS_MID_JOB)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    for _ in range(3):
        done = subprocess.run([sys.executable, str(script), str(models_dir)], env=env,
                              capture_output=True, text=True, timeout=180)
        assert "exiting at" in done.stdout, done.stderr[-2000:]
        assert done.returncode == 0, done.stderr[-2000:]
        assert "terminate called" not in done.stderr
        assert "because this process is exiting" in done.stderr


def test_a_full_queue_answers_503_with_retry_after(make_app):
    service = make_app(ANIMEGAN_JOB_MAX_QUEUE=1).extensions["animegan"]
    data = gif_from_photos(60, size=(128, 96))
    running = submit(service, data, size=128)
    follow(service, running.id, lambda r: r.state == JobState.RUNNING)
    waiting = submit(service, data, client="127.0.0.2", size=128)
    with pytest.raises(Overloaded) as refused:
        submit(service, data, client="127.0.0.3", size=128)
    assert refused.value.status == 503 and refused.value.retry_after > 0
    assert "queue is full" in str(refused.value)
    assert service.jobs.status()["queued"] == 1
    for job in (running, waiting):
        service.jobs.cancel(job.id)
    follow(service, running.id, finished, timeout=30)


def test_unfinished_jobs_are_counted_per_client(service):
    data = gif_from_photos(60, size=(128, 96))
    jobs = [submit(service, data, client="10.0.0.1", size=128) for _ in range(2)]
    assert service.jobs.unfinished("10.0.0.1") == 2
    assert service.jobs.unfinished("10.0.0.2") == 0
    for job in jobs:
        service.jobs.cancel(job.id)
    assert service.jobs.unfinished("10.0.0.1") <= 1  # the running one stops at a frame
    follow(service, jobs[0].id, finished, timeout=30)
    assert service.jobs.unfinished("10.0.0.1") == 0


def stalled_copy(service, data: bytes, attempts: int, client: str = CLIENT,
                 reported: float | None = None) -> JobRecord:
    """A job as a killed worker leaves it: running, listed among the started runs, its last
    report at ``reported`` (default: longer ago than the stall time); ``attempts`` 2: its
    first run was lost too, before it finished a segment."""
    info = service.jobs.probe(data)
    record = service.jobs.store.create(data, client=client, style="test_style", size=96,
                                       kind=info.kind, format=info.format,
                                       frames_total=info.frames)
    record.state, record.attempts, record.frames_done = JobState.RUNNING, attempts, 3
    record.lost_runs = attempts - 1
    record.updated_at = (reported if reported is not None
                         else time.time() - work.JOB_STALL_SECONDS - 1)
    service.jobs.store.start(record)
    return record


def stored(service, job_id: str, until, timeout: float = 60.0) -> tuple[float, JobRecord]:
    """Read the record straight from storage (which settles nothing) every 50 ms until
    ``until(record)``: (the time, the record)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.jobs.store.get(job_id)
        assert record is not None
        if until(record):
            return time.time(), record
        time.sleep(0.05)
    pytest.fail(f"job {job_id} still {record.state} in storage after {timeout} s: {record}")


def test_a_client_is_not_held_by_a_job_whose_worker_died(service):
    """The per-client count settles what it counts: a run stalled a second time is failed,
    so it no longer counts (read as stored, it stayed 'running' until its TTL)."""
    stalled = stalled_copy(service, gif_from_photos(4), attempts=2, client="10.0.0.9")
    assert service.jobs.store.get(stalled.id).state == JobState.RUNNING
    assert service.jobs.unfinished("10.0.0.9") == 0
    assert service.jobs.store.get(stalled.id).state == JobState.FAILED
    # a first stall is queued again: that job is still the client's, and runs to its end
    again = stalled_copy(service, gif_from_photos(4), attempts=1, client="10.0.0.9")
    assert service.jobs.unfinished("10.0.0.9") == 1
    assert follow(service, again.id, finished)[-1].state == JobState.DONE
    assert service.jobs.unfinished("10.0.0.9") == 0


@pytest.mark.parametrize("attempts", [1, 2])
def test_the_sweep_settles_a_stalled_job_nobody_reads(make_app, attempts, monkeypatch):
    """The local queue's sweep, every stall/4 s: a run whose worker stopped reporting is
    queued again and done (first stall) or failed (second), read only from storage."""
    monkeypatch.setattr("flask_animegan.jobs.work.JOB_STALL_SECONDS", 2)
    service = make_app().extensions["animegan"]
    assert service.jobs.sweep_every == 0.5
    first = submit(service, gif_from_photos(3))  # the queue's thread (and sweep) start
    stored(service, first.id, finished)
    record = stalled_copy(service, gif_from_photos(6), attempts=attempts,
                          reported=time.time())  # its worker dies now
    ended_at, final = stored(service, record.id, finished, timeout=60)
    took = ended_at - record.updated_at
    print(f"attempt {attempts}: {final.state.value} {took:.2f} s after the last report")
    if attempts == 1:
        assert final.state == JobState.DONE and final.attempts == 2 and final.frames_done == 6
    else:
        assert final.state == JobState.FAILED and final.error == STALLED
        # the bound the docs promise: stall + sweep period (+ a loaded machine's slack)
        assert took <= 2 + 0.5 + 5


def test_settling_one_run_twice_queues_it_once(service):
    """Two readers (or sweepers) holding the same stale record: one settles it, the
    other gets the record as stored; the job runs once more, not twice."""
    record = stalled_copy(service, gif_from_photos(6), attempts=1)
    copy = service.jobs.store.get(record.id)
    assert service.jobs.settle(record).state == JobState.QUEUED
    assert service.jobs.settle(copy).state != JobState.FAILED
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.DONE and final.attempts == 2
    time.sleep(0.5)
    assert service.jobs.status()["queued"] == 0 and service.jobs.get(record.id).attempts == 2


def test_a_job_queued_twice_runs_once(service):
    """Two workers taking the same run at the same moment: the run's claim lets one in."""
    info = service.jobs.probe(data := gif_from_photos(6))
    record = service.jobs.store.create(data, client=CLIENT, style="test_style", size=96,
                                       kind=info.kind, format=info.format,
                                       frames_total=info.frames)
    assert service.jobs.store.claim(record.id, "run-1", 5)
    service.jobs.run(record.id)  # the second taker of run 1: leaves it to the first
    assert service.jobs.store.get(record.id).state == JobState.QUEUED
    assert not service.jobs.store.claim(record.id, "run-1", 5)
    assert service.jobs.store.claim(record.id, "run-2", 5)


def test_a_stalled_job_is_run_again_once(service):
    data = gif_from_photos(10)
    record = stalled_copy(service, data, attempts=1)
    settled = service.jobs.get(record.id)
    assert settled.state in (JobState.QUEUED, JobState.RUNNING, JobState.DONE)
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.DONE and final.frames_done == 10 and final.attempts == 2


def test_a_job_stalled_twice_is_failed(service):
    record = stalled_copy(service, gif_from_photos(10), attempts=2)
    settled = service.jobs.get(record.id)
    assert settled.state == JobState.FAILED and settled.error == STALLED
    assert service.jobs.get(record.id).state == JobState.FAILED
    assert service.jobs.store.get_input(record.id) is None


def test_a_fresh_running_job_is_left_alone(service):
    record = stalled_copy(service, gif_from_photos(10), attempts=1)
    record.updated_at = time.time()
    service.jobs.store.update(record)
    assert service.jobs.get(record.id).state == JobState.RUNNING


@pytest.mark.parametrize("job_id", ["", "x", "../../etc", "a" * 31, "a" * 33, "a" * 32])
def test_no_such_job(service, job_id):
    assert service.jobs.get(job_id) is None
    assert service.jobs.cancel(job_id) is None
    assert service.jobs.store.get_result(job_id) is None


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.9])
def test_a_truncated_gif_fails_with_a_clear_message(service, keep):
    """Probing reads headers only; a GIF cut short is found while decoding: the job fails
    with the decoder's message, never the server's generic one."""
    data = gif_from_photos(10)
    data = data[: int(len(data) * keep)]
    try:
        record = submit(service, data)
    except ConversionError as refused:  # found at the door
        assert refused.status in (400, 413, 415)
        return
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.FAILED
    assert final.error and final.error != INTERNAL and "truncated or corrupt" in final.error


def test_rq_without_redis_stops_the_app_at_start(make_app):
    with pytest.raises(RuntimeError, match="ANIMEGAN_JOB_QUEUE='rq' needs a Redis"):
        make_app(ANIMEGAN_JOB_QUEUE="rq")


# -- the repeat rule (convert/repeats.py): generated H.264 clips, bench/jobs.py's ----------------
def rule_on(motion, name: str = "chelsea", count: int = 24):
    """The rule over a generated clip's frames, decoded and fitted as a job does (128 px)."""
    from bench.jobs import apply_rule, decoded, motion_clip

    return apply_rule(decoded(motion_clip(motion, count, (192, 128), name), 128))


def motions(group: str) -> list:
    from bench import jobs

    return list(getattr(jobs, group))


@pytest.mark.parametrize("name", ["chelsea", "camera"])
@pytest.mark.parametrize("motion", motions("HELD"), ids=lambda m: m.label)
def test_a_held_shot_is_reused_at_every_crf(motion, name):
    """x264 refines a held shot's picture frame by frame; its frames still repeat the first."""
    run = rule_on(motion, name)
    assert run.share >= 0.9, run
    assert run.worst_shift <= repeats.SHIFT_LEVELS and run.worst_block <= repeats.BLOCK_LEVELS


@pytest.mark.parametrize("name", ["chelsea", "camera"])
@pytest.mark.parametrize("motion", motions("MOVING"), ids=lambda m: m.label)
def test_pans_zooms_moving_boxes_and_fades_are_converted(motion, name):
    """Visible movement, from a pan of 0.5 px a frame to a box of 5 % of the picture
    crossing a still background: (almost) every frame is converted again."""
    run = rule_on(motion, name)
    assert run.share <= 0.1, run


@pytest.mark.parametrize("step", [0.05, 0.1, 0.2, 0.3, 0.45])
def test_a_slow_change_cannot_creep_past_the_rule(step):
    """Each frame a little brighter than the one before (``step`` levels on average): the
    rule compares with the last converted frame, so a reused result is never further than
    the rule allows from its frame, and a frame is converted at least once in every
    SHIFT_LEVELS // step + 1 frames."""
    from bench.jobs import apply_rule

    rng = np.random.default_rng(0)
    base = np.asarray(next(camera_move(1, (96, 64))), np.int16).clip(0, 250)
    frames, pixels = [], base.copy()
    for _ in range(40):  # ``step`` of the pixels' channel values one level up
        pixels = pixels + (rng.random(pixels.shape) < step)
        frames.append(Image.fromarray(pixels.clip(0, 255).astype(np.uint8)))
    run = apply_rule(frames)
    assert run.worst_shift <= repeats.SHIFT_LEVELS
    converted = run.frames - run.reused
    assert converted >= 40 // (int(repeats.SHIFT_LEVELS / step) + 1) - 1, run


def test_the_rule_never_reuses_across_sizes_and_finds_identical_frames():
    image = next(camera_move(1, (96, 64)))
    same, other = repeats.Picture.of(image), repeats.Picture.of(image.resize((95, 64)))
    assert repeats.is_repeat(repeats.Picture.of(image.copy()), same)
    assert not repeats.is_repeat(other, same) and repeats.difference(other, same) is None
    assert not repeats.is_repeat(same, None)
    # a change in the last, partial row of blocks counts in full, not diluted by padding
    edge = np.asarray(image).copy()
    edge[-1, :12] = 255 - edge[-1, :12]
    measured = repeats.difference(repeats.Picture.of(Image.fromarray(edge)), same)
    assert measured is not None and not measured.repeat


def test_a_held_video_shot_at_crf_23_is_converted_once_through_a_job(service):
    """Through the job path: a second held at x264's default quality, then a pan."""
    data = video_clip(seconds=2.0, fps=12, size=(96, 64), audio=False, static_seconds=1.0)
    record = submit(service, data)
    final = follow(service, record.id, finished)[-1]
    assert final.state == JobState.DONE, final.error
    assert final.frames_done == 24
    assert 10 <= final.frames_reused <= 12, final  # 11 of the 12 held frames


def test_a_job_whose_decode_helper_is_starved_runs_again(make_app, monkeypatch):
    """A frames helper that gets no CPU (SIGSTOP, as a busy machine starves it) past its
    timeout is the machine's fault, not the file's (a 503 at the door): the job's run
    ends there, the job is queued again, and its second run, with a fresh helper,
    finishes it."""
    import contextlib
    import os
    import signal

    from flask_animegan.inputs.isolation import POOL

    monkeypatch.setattr("flask_animegan.inputs.isolation.DECODE_TIMEOUT", 1.0)
    service = make_app(ANIMEGAN_DECODE_ISOLATION="process").extensions["animegan"]
    data = gif_from_photos(6, size=(96, 64), durations=50)
    record = service.jobs.store.create(data, client=CLIENT, style="test_style", size=96,
                                       kind="animation", format="GIF", frames_total=6)
    POOL.close()
    POOL.give_back(POOL.take())
    helper = POOL._idle[0]
    os.kill(helper.process.pid, signal.SIGSTOP)
    try:
        service.jobs.run(record.id)  # the first run, in this thread: its probe starves
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper.process.pid, signal.SIGCONT)
    final = follow(service, record.id, finished)[-1]  # the local queue's thread runs it again
    assert final.state == JobState.DONE, final.error
    assert final.attempts == 2 and final.frames_done == 6
