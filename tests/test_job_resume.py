"""Video jobs that survive their worker: real Redis, real ``flask animegan worker``
processes, a 20-second video with audio. A worker SIGKILLed at about 60 % of the frames
(a crash, an OOM kill) or sent SIGTERM (a deploy) loses one segment at most: another
worker resumes at the first segment missing, progress never falls below half the frames,
and the result is an uninterrupted run's (frame count, audio, pictures)."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest
from media import video_clip
from test_job_segments import frames_and_audio, psnr
from test_jobs_workers import (
    Workers,
    redis_app,
    wait_for_state,
    wait_for_workers,
    worker_env,
)

from flask_animegan.jobs.queues import RQQueue
from flask_animegan.jobs.records import JobState

pytestmark = [pytest.mark.redis, pytest.mark.server]

#: The worker timeout: a killed worker's run is handed on within it.
TIMEOUT = 6
SECONDS, FPS = 20.0, 6  # 120 frames, segments of 12
KILL_AT = 0.6  # of the frames


def converted(service, job_id: str) -> tuple[list[np.ndarray], list[float], float | None]:
    return frames_and_audio(service.jobs.store.get_result(job_id))


def interrupted(service, workers: Workers, data: bytes, signum: int) -> dict:
    """Submit ``data``, send ``signum`` to its worker once KILL_AT of the frames are done,
    follow the job to its end (every 20 ms): what happened, in figures."""
    from rq.job import Job

    rq = service.jobs.queue
    sent = time.monotonic()
    record = service.jobs.submit(data, service.jobs.probe(data), style="test_style",
                                 size=128, client="127.0.0.1")
    total = record.frames_total
    running = wait_for_state(service, record.id, lambda r: r.state == JobState.RUNNING
                             and r.frames_done >= KILL_AT * total or r.finished, timeout=120)
    assert not running.finished, "the job ended before the signal: make it longer"
    victim = Job.fetch(RQQueue.rq_id(record.id, running.attempts - 1),
                       connection=rq.connection).worker_name
    workers.started[victim].send_signal(signum)
    signalled = time.monotonic()
    at_signal = service.jobs.store.get(record.id)
    lowest = at_signal.frames_done
    exited = None
    while not (current := service.jobs.store.get(record.id)).finished:
        lowest = min(lowest, current.frames_done)
        if exited is None and workers.started[victim].poll() is not None:
            exited = time.monotonic() - signalled
        assert time.monotonic() - signalled < 180, current
        time.sleep(0.02)
    if exited is None:
        workers.started[victim].wait(timeout=30)
        exited = time.monotonic() - signalled
    return {"record": current, "total": total, "victim": victim, "at_signal":
            at_signal.frames_done, "lowest": lowest, "seconds": time.monotonic() - sent,
            "exited": exited}


def test_a_video_job_resumes_on_another_worker_after_sigkill_and_sigterm(
        make_app, redis_server, models_dir, tmp_path):
    app = redis_app(make_app, redis_server, TIMEOUT)
    service = app.extensions["animegan"]
    workers = Workers(worker_env(models_dir, redis_server.uri, TIMEOUT), tmp_path)
    data = video_clip(SECONDS, FPS, size=(128, 96), name="coffee")
    try:
        for name in ("w0", "w1"):
            workers.start(name)
        wait_for_workers(service, 2)
        # the uninterrupted run, to compare with
        sent = time.monotonic()
        whole = service.jobs.submit(data, service.jobs.probe(data), style="test_style",
                                    size=128, client="127.0.0.1")
        whole = wait_for_state(service, whole.id, lambda r: r.finished, timeout=180)
        baseline = time.monotonic() - sent
        assert whole.state == JobState.DONE and whole.attempts == 1, whole
        expected, expected_times, expected_audio = converted(service, whole.id)
        assert len(expected) == whole.frames_total == int(SECONDS * FPS)
        assert expected_audio == pytest.approx(SECONDS, abs=0.05)  # the source's own

        for signum, replacement in ((signal.SIGKILL, "w2"), (signal.SIGTERM, None)):
            run = interrupted(service, workers, data, signum)
            record, total = run["record"], run["total"]
            name = signal.Signals(signum).name
            print(f"{name} at frame {run['at_signal']} of {total}: lowest progress after "
                  f"it {run['lowest']}, the worker gone in {run['exited']:.1f} s, done in "
                  f"{run['seconds']:.1f} s against {baseline:.1f} s uninterrupted "
                  f"({run['seconds'] / baseline:.2f}x); runs {record.attempts}")
            assert record.state == JobState.DONE, record.error
            assert record.attempts == 2 and record.lost_runs == 0, record
            assert run["lowest"] >= total / 2, "progress fell below half the frames"
            assert record.frames_done == record.frames_total == total
            pictures, times, audio_end = converted(service, record.id)
            assert len(pictures) == len(expected) and times == expected_times
            assert audio_end == pytest.approx(expected_audio, abs=0.05)
            worst = min(psnr(a, b) for a, b in zip(pictures, expected))
            print(f"{name}: the lowest PSNR against the uninterrupted run {worst:.1f} dB")
            assert worst >= 40
            if signum == signal.SIGTERM:  # handed back at once, not left for the stall rule
                log = (tmp_path / f"{run['victim']}.log").read_text()
                assert "was handed back at frame" in log, log[-2000:]
            if replacement:
                workers.start(replacement)
                wait_for_workers(service, 2)
    finally:
        workers.stop()
