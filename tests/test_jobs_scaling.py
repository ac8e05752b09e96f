"""The signals to scale job workers on, in /metrics, labelled by queue: jobs waiting, the
oldest one's age, jobs running, live workers (RQ's worker registry) and frames converted
(a counter, and per second over the last minute), read from the queue at each scrape.

The Redis tests run a real redis-server and real ``flask animegan worker`` processes, on a
worker timeout of a few seconds; the app in this process plays the web process."""

from __future__ import annotations

import logging
import signal
import time

import pytest
from media import gif_from_photos
from test_jobs_api import post_job, wait_for
from test_jobs_workers import TIMEOUT, Workers, redis_app, wait_for_state, worker_env
from test_metrics import scrape, value

from flask_animegan.jobs.queues import QUEUE_NAME
from flask_animegan.jobs.records import JobState


def gauges(client, queue: str) -> dict[str, float]:
    """The job queue's samples of one scrape, by name (the queue's label dropped)."""
    samples = scrape(client.get("/animegan/metrics").get_data(as_text=True))
    return {name: sample for (name, labels), sample in samples.items()
            if name.startswith("animegan_job_") and labels == (("queue", queue),)}


def test_the_local_queue_reports_its_jobs_and_the_frames_it_converted(make_app):
    app = make_app(ANIMEGAN_METRICS=True)
    client = app.test_client()
    before = gauges(client, "local")
    assert before == {"animegan_job_queue_up": 1, "animegan_job_queued": 0,
                      "animegan_job_oldest_queued_seconds": 0, "animegan_job_running": 0,
                      "animegan_job_workers": 1, "animegan_job_frames_per_second": 0,
                      "animegan_job_frames_total": 0}
    posted = post_job(client, gif_from_photos(6), size="32")
    assert posted.status_code == 202, posted.get_json()
    assert wait_for(client, posted.headers["Location"])[-1]["state"] == "done"
    after = gauges(client, "local")
    assert after["animegan_job_frames_total"] == 6
    assert after["animegan_job_frames_per_second"] > 0
    status = app.extensions["animegan"].jobs.status()
    assert status["name"] == "local" and status["frames_total"] == 6


@pytest.mark.redis
def test_with_no_worker_three_queued_jobs_show_and_the_oldest_ages(make_app, redis_server,
                                                                   caplog):
    app = redis_app(make_app, redis_server, TIMEOUT)
    client = app.test_client()
    empty = gauges(client, QUEUE_NAME)
    assert empty["animegan_job_queued"] == 0 and empty["animegan_job_workers"] == 0
    for index in range(3):  # three clients: a client may have two unfinished jobs
        posted = post_job(client, gif_from_photos(4, size=(64, 48)), size="64",
                          environ={"REMOTE_ADDR": f"127.0.0.{index + 1}"})
        assert posted.status_code == 202, posted.get_json()
    first = gauges(client, QUEUE_NAME)
    time.sleep(1.2)
    second = gauges(client, QUEUE_NAME)
    print(f"no worker, three jobs: {first} then {second}")
    for scraped in (first, second):
        assert scraped["animegan_job_queue_up"] == 1
        assert scraped["animegan_job_queued"] == 3
        assert scraped["animegan_job_workers"] == 0
        assert scraped["animegan_job_running"] == 0
        assert scraped["animegan_job_frames_total"] == 0
    assert second["animegan_job_oldest_queued_seconds"] >= (
        first["animegan_job_oldest_queued_seconds"] + 1.0)

    # Redis gone: the queue is down, its other series absent (no stale values), and a
    # worker's count of frames is dropped with one warning, never an error
    queue = app.extensions["animegan"].jobs.queue
    redis_server.stop()
    down = gauges(client, QUEUE_NAME)
    assert down == {"animegan_job_queue_up": 0}
    with caplog.at_level(logging.WARNING, logger="flask_animegan"):
        for _ in range(3):
            queue.frames_converted(5)
    assert len([r for r in caplog.records if "frames converted" in r.getMessage()]) == 1


@pytest.mark.redis
@pytest.mark.server
def test_two_workers_count_frames_and_a_killed_one_leaves_the_live_count(
        make_app, redis_server, models_dir, tmp_path):
    app = redis_app(make_app, redis_server, TIMEOUT)
    service = app.extensions["animegan"]
    client = app.test_client()
    workers = Workers(worker_env(models_dir, redis_server.uri, TIMEOUT), tmp_path)
    try:
        for name in ("w0", "w1"):
            workers.start(name)
        deadline = time.monotonic() + 120
        while gauges(client, QUEUE_NAME)["animegan_job_workers"] < 2:
            assert time.monotonic() < deadline, "two workers did not beat within 120 s"
            time.sleep(0.2)

        posted = post_job(client, gif_from_photos(8, size=(128, 96)), size="128")
        assert posted.status_code == 202, posted.get_json()
        job_id = posted.get_json()["id"]
        record = wait_for_state(service, job_id, lambda r: r.finished, timeout=120)
        assert record.state == JobState.DONE, record.error
        done = gauges(client, QUEUE_NAME)
        print(f"after a job of 8 frames: {done}")
        assert done["animegan_job_frames_total"] == 8
        assert done["animegan_job_frames_per_second"] > 0
        assert done["animegan_job_queued"] == done["animegan_job_running"] == 0

        assert gauges(client, QUEUE_NAME)["animegan_job_workers"] == 2
        workers.started["w0"].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        workers.started["w0"].wait(timeout=10)
        while gauges(client, QUEUE_NAME)["animegan_job_workers"] != 1:
            assert time.monotonic() - killed < TIMEOUT + 5, "the dead worker still counts"
            time.sleep(0.1)
        gone = time.monotonic() - killed
        print(f"live workers went from 2 to 1 {gone:.1f} s after the SIGKILL "
              f"(ANIMEGAN_JOB_WORKER_TIMEOUT={TIMEOUT})")
        assert gone <= TIMEOUT + 1.5  # its last beat, at most the timeout old, then a scrape
    finally:
        workers.stop()
