"""Jobs that never wait in silence: job workers beat (ANIMEGAN_JOB_WORKER_TIMEOUT), a job
queued with no live worker says so (API, page, log, /healthz, /metrics), and a run whose
worker died, started or not, is queued again within the timeout.

The Redis tests run a real redis-server and real ``flask animegan worker`` processes, on a
timeout of a few seconds; the app in this process plays the web process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from media import gif_from_photos
from test_jobs_api import post_job
from test_metrics import scrape, value

from flask_animegan.jobs.queues import ENTRY_POINT, QUEUE_NAME, RQQueue
from flask_animegan.jobs.records import JobRecord, JobState
from flask_animegan.jobs.work import NO_WORKER

REPO = Path(__file__).resolve().parent.parent
SECRET = "jobs-workers-test-secret"
#: The worker timeout of the Redis tests: short, so that they wait seconds, not a minute.
TIMEOUT = 3
#: Where a run is killed mid-conversion, a little more, so a loaded test machine's late
#: beat is no death (a third of it between beats).
KILL_TIMEOUT = 6


# -- the setting and the fields, without Redis ------------------------------------------
@pytest.mark.parametrize(("timeout", "beat"), [(3, 1), (5, 1), (20, 6), (60, 10), (3600, 10)])
def test_a_worker_beats_every_third_of_the_timeout_ten_seconds_at_most(make_app, timeout,
                                                                       beat):
    settings = make_app(ANIMEGAN_JOB_WORKER_TIMEOUT=timeout).extensions["animegan"].settings
    assert settings.job_worker_beat == beat
    assert settings.job_worker_beat < settings.job_worker_timeout


@pytest.mark.parametrize("bad", [2, 0, -1, 3601])
def test_a_worker_timeout_that_cannot_work_stops_the_app_naming_the_key(make_app, bad):
    with pytest.raises(RuntimeError, match="ANIMEGAN_JOB_WORKER_TIMEOUT"):
        make_app(ANIMEGAN_JOB_WORKER_TIMEOUT=bad)


def test_without_redis_the_jobs_thread_is_the_live_worker(make_app):
    """The local queue: one worker in the process, never "no worker", gauges to match."""
    app = make_app(ANIMEGAN_METRICS=True, ANIMEGAN_JOB_WORKER_TIMEOUT=3)
    client = app.test_client()
    health = client.get("/animegan/healthz").get_json()
    assert health["status"] == "ok"
    jobs = health["jobs"]
    assert jobs["kind"] == "local" and jobs["workers"] == 1 and jobs["no_worker"] is False
    assert jobs["oldest_queued_s"] is None and jobs["worker_timeout_s"] == 3
    samples = scrape(client.get("/animegan/metrics").get_data(as_text=True))
    assert value(samples, "animegan_job_workers", queue="local") == 1
    assert value(samples, "animegan_job_oldest_queued_seconds", queue="local") == 0

    posted = post_job(client, gif_from_photos(4), size="64")
    assert posted.status_code == 202
    assert posted.get_json()["waiting"] is None and posted.get_json()["waiting_message"] is None
    job_url = posted.get_json()["url"]
    deadline = time.monotonic() + 60
    while (job := client.get(job_url).get_json())["state"] != "done":
        assert time.monotonic() < deadline, job
        assert job["waiting"] is None
        time.sleep(0.05)


def test_the_local_queue_tells_how_long_its_oldest_job_waits(make_app):
    """While the jobs' thread is busy, the next job's wait shows in /healthz."""
    app = make_app(ANIMEGAN_JOB_WORKER_TIMEOUT=3)
    service = app.extensions["animegan"]
    client = app.test_client()
    gate = service.engine.gate
    with gate.slot():  # the thread's first job waits for the model; the second for the thread
        first = post_job(client, gif_from_photos(3), size="64").get_json()
        second = post_job(client, gif_from_photos(3), size="64").get_json()
        release_at = time.monotonic() + 1.5  # the second job has waited at least this long
        while time.monotonic() < release_at:
            time.sleep(0.1)
        jobs = client.get("/animegan/healthz").get_json()["jobs"]
    assert jobs["queued"] >= 1 and jobs["oldest_queued_s"] >= 1.0, jobs
    assert jobs["no_worker"] is False  # the thread lives: a busy worker is no missing one
    for job in (first, second):
        deadline = time.monotonic() + 60
        while client.get(job["url"]).get_json()["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)


# -- on Redis, with real workers ----------------------------------------------------------
def worker_env(models_dir: Path, redis_uri: str, timeout: int) -> dict[str, str]:
    env = {key: val for key, val in os.environ.items() if not key.startswith("ANIMEGAN_")}
    env.update({
        "PYTHONPATH": str(REPO), "FLASK_SECRET_KEY": SECRET,
        "ANIMEGAN_STORAGE_URI": redis_uri, "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_SHIPPED_STYLES": "false", "ANIMEGAN_BACKEND": "torch",
        "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_WARMUP_SIZE": "32",
        "ANIMEGAN_SAMPLE_SIZE": "0", "ANIMEGAN_MAX_SIDE": "128",
        "ANIMEGAN_TORCH_THREADS": "1", "ANIMEGAN_JOB_WORKER_TIMEOUT": str(timeout),
    })
    return env


class Workers:
    """``flask animegan worker`` processes started on demand, stopped at the end."""

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self.env, self.folder = env, folder
        self.started: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> subprocess.Popen[bytes]:
        with (self.folder / f"{name}.log").open("wb") as log:
            self.started[name] = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", "example_app", "animegan", "worker",
                 "--name", name], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self.started[name]

    def stop(self) -> None:
        for process in self.started.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.started.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for name in self.started:
            print(f"--- {name}.log\n{(self.folder / f'{name}.log').read_text()[-2500:]}")


def redis_app(make_app, redis_server, timeout: int):
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, SECRET_KEY=SECRET,
                   ANIMEGAN_METRICS=True, ANIMEGAN_JOB_WORKER_TIMEOUT=timeout)
    assert isinstance(app.extensions["animegan"].jobs.queue, RQQueue)
    return app


def wait_for_workers(service, count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while service.jobs.status().get("workers", 0) < count:
        assert time.monotonic() < deadline, f"{count} workers did not beat within {timeout} s"
        time.sleep(0.2)


def wait_for_state(service, job_id: str, until, timeout: float) -> JobRecord:
    """The record, read from storage every 20 ms (reading settles nothing), once ``until``."""
    deadline = time.monotonic() + timeout
    while not until(record := service.jobs.store.get(job_id)):
        assert time.monotonic() < deadline, f"still {record.state} after {timeout} s: {record}"
        time.sleep(0.02)
    return record


@pytest.mark.redis
@pytest.mark.server
def test_with_no_worker_a_job_says_so_then_a_started_worker_does_it(
        make_app, redis_server, models_dir, tmp_path, caplog):
    app = redis_app(make_app, redis_server, TIMEOUT)
    service = app.extensions["animegan"]
    client = app.test_client()
    workers = Workers(worker_env(models_dir, redis_server.uri, TIMEOUT), tmp_path)
    try:
        assert client.get("/animegan/healthz").get_json()["status"] == "ok"
        with caplog.at_level(logging.WARNING, logger="flask_animegan"):
            posted = post_job(client, gif_from_photos(8, size=(128, 96)), size="128")
            assert posted.status_code == 202, posted.get_json()
            sent = time.monotonic()
            job_url, page_url = posted.get_json()["url"], posted.get_json()["page_url"]
            while (job := client.get(job_url).get_json())["waiting"] is None:
                assert job["state"] == "queued" and job["waiting_message"] is None
                assert time.monotonic() - sent < TIMEOUT + 10, "no notice of the missing worker"
                time.sleep(0.1)
            noticed = time.monotonic() - sent
            assert job["waiting"] == "no_worker" and job["waiting_message"] == NO_WORKER
            assert job["state"] == "queued"
            assert noticed >= TIMEOUT - 0.5  # never before the timeout
            # the page, without JavaScript, says it instead of "Waiting for a worker"
            page = client.get(page_url).get_data(as_text=True)
            assert "No worker is running: the site&#39;s administrator has been told." in page
            assert "Waiting for a worker" not in page
            # polls within one timeout: one warning in the log, not one per poll
            for _ in range(8):
                assert client.get(job_url).get_json()["waiting"] == "no_worker"
                time.sleep(0.1)
            response = client.get("/animegan/healthz")
            warnings = [r for r in caplog.records if "no job worker" in r.getMessage()]
        assert response.status_code == 200  # degraded: the instance still converts photos
        health = response.get_json()
        assert health["status"] == "degraded", health
        jobs = health["jobs"]
        assert jobs["workers"] == 0 and jobs["queued"] == 1 and jobs["no_worker"] is True
        assert jobs["oldest_queued_s"] >= TIMEOUT
        assert any("no worker" in problem for problem in health["problems"]), health
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        samples = scrape(client.get("/animegan/metrics").get_data(as_text=True))
        assert value(samples, "animegan_job_workers", queue=QUEUE_NAME) == 0
        assert value(samples, "animegan_job_oldest_queued_seconds", queue=QUEUE_NAME) >= TIMEOUT
        print(f"the job said 'no worker' {noticed:.1f} s after it was sent "
              f"(ANIMEGAN_JOB_WORKER_TIMEOUT={TIMEOUT})")

        started = time.monotonic()
        workers.start("late")
        record = wait_for_state(service, job["id"], lambda r: r.finished, timeout=180)
        assert record.state == JobState.DONE, record.error
        assert record.frames_done == 8
        final = client.get(job_url).get_json()
        assert final["waiting"] is None and final["waiting_message"] is None
        health = client.get("/animegan/healthz").get_json()
        assert health["status"] == "ok" and health["jobs"]["workers"] == 1, health
        samples = scrape(client.get("/animegan/metrics").get_data(as_text=True))
        assert value(samples, "animegan_job_workers", queue=QUEUE_NAME) == 1
        assert value(samples, "animegan_job_oldest_queued_seconds", queue=QUEUE_NAME) == 0
        print(f"a worker started then did it in {time.monotonic() - started:.1f} s "
              "(its start, model load and warm-up included)")
    finally:
        workers.stop()


@pytest.mark.redis
@pytest.mark.server
def test_a_worker_killed_right_after_taking_a_job_leaves_it_to_another(
        make_app, redis_server, models_dir, tmp_path):
    from rq.job import Job

    app = redis_app(make_app, redis_server, KILL_TIMEOUT)
    service = app.extensions["animegan"]
    rq = service.jobs.queue
    workers = Workers(worker_env(models_dir, redis_server.uri, KILL_TIMEOUT), tmp_path)
    try:
        for name in ("w0", "w1"):
            workers.start(name)
        wait_for_workers(service, 2)
        data = gif_from_photos(40, size=(128, 96))
        record = service.jobs.submit(data, service.jobs.probe(data), style="test_style",
                                     size=128, client="127.0.0.1")
        rq_id = RQQueue.rq_id(record.id, 0)
        registry = rq.queue.started_job_registry
        deadline = time.monotonic() + 60
        victim = None
        while victim is None:  # a run in RQ's registry, once it names its worker
            assert time.monotonic() < deadline, "no worker took the job"
            if rq_id in registry.get_job_ids(cleanup=False):
                victim = Job.fetch(rq_id, connection=rq.connection).worker_name
            time.sleep(0.002)
        workers.started[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        workers.started[victim].wait(timeout=10)
        at_kill = service.jobs.store.get(record.id)

        again = wait_for_state(service, record.id,
                               lambda r: r.state == JobState.RUNNING and r.attempts == 2
                               or r.finished, timeout=KILL_TIMEOUT + 30)
        running_again = time.monotonic() - killed
        final = wait_for_state(service, record.id, lambda r: r.finished, timeout=180)
        print(f"killed {victim} with the job {at_kill.state.value} "
              f"(frames done {at_kill.frames_done}); running again on the other worker "
              f"{running_again:.1f} s after the kill, done {time.monotonic() - killed:.1f} s "
              f"after it (ANIMEGAN_JOB_WORKER_TIMEOUT={KILL_TIMEOUT})")
        assert again.state == JobState.RUNNING, again
        assert running_again <= KILL_TIMEOUT + 5
        assert final.state == JobState.DONE and final.attempts == 2, final
        assert final.frames_done == 40
    finally:
        workers.stop()


@pytest.mark.redis
@pytest.mark.server
def test_a_job_taken_by_a_worker_that_dies_before_starting_it_is_run_again(
        make_app, redis_server, models_dir, tmp_path):
    """A worker that takes the job as RQ does (the run in RQ's started registry) and is
    gone before our code marks it running: the job is queued again within the timeout."""
    app = redis_app(make_app, redis_server, KILL_TIMEOUT)
    service = app.extensions["animegan"]
    rq = service.jobs.queue
    workers = Workers(worker_env(models_dir, redis_server.uri, KILL_TIMEOUT), tmp_path)
    ghost = rq.make_worker("ghost")
    try:
        workers.start("survivor")
        wait_for_workers(service, 1)
        data = gif_from_photos(6, size=(128, 96))
        info = service.jobs.probe(data)
        record = service.jobs.store.create(data, client="127.0.0.1", style="test_style",
                                           size=128, kind=info.kind, format=info.format,
                                           frames_total=info.frames)
        # what a worker does between taking a job off the queue and running it
        ghost.register_birth()
        job = rq.queue.create_job(ENTRY_POINT, args=(record.id,),
                                  job_id=RQQueue.rq_id(record.id, 0), result_ttl=0)
        job.save()
        ghost.prepare_execution(job)
        ghost.prepare_job_execution(job)
        taken = time.monotonic()  # ... and then nothing: the ghost is gone
        assert service.jobs.store.get(record.id).state == JobState.QUEUED

        again = wait_for_state(service, record.id,
                               lambda r: r.state != JobState.QUEUED or r.attempts > 0,
                               timeout=KILL_TIMEOUT + 30)
        requeued = time.monotonic() - taken
        final = wait_for_state(service, record.id, lambda r: r.finished, timeout=120)
        print(f"taken and abandoned: queued again {requeued:.1f} s later, done "
              f"{time.monotonic() - taken:.1f} s later (ANIMEGAN_JOB_WORKER_TIMEOUT="
              f"{KILL_TIMEOUT})")
        assert again.attempts >= 1, again
        assert requeued <= KILL_TIMEOUT + 3
        assert final.state == JobState.DONE and final.attempts == 2, final
    finally:
        ghost.register_death()
        workers.stop()


@pytest.mark.redis
@pytest.mark.server
def test_a_run_failed_by_another_cleaner_of_rqs_registry_is_run_again_by_a_reader(
        make_app, redis_server, models_dir, tmp_path):
    """Another tool cleans RQ's registry first (``rq info`` counting it does), failing the
    abandoned run without our handler: the job's next reader after the timeout queues it."""
    app = redis_app(make_app, redis_server, TIMEOUT)
    service = app.extensions["animegan"]
    client = app.test_client()
    rq = service.jobs.queue
    workers = Workers(worker_env(models_dir, redis_server.uri, TIMEOUT), tmp_path)
    ghost = rq.make_worker("ghost")
    try:
        job_url = post_job(client, gif_from_photos(6, size=(128, 96)),
                           size="128").get_json()["url"]
        job_id = job_url.rsplit("/", 1)[1]
        ghost.register_birth()
        job, _ = ghost.dequeue_job_and_maintain_ttl(timeout=5)
        assert job.id == RQQueue.rq_id(job_id, 0)
        ghost.prepare_execution(job)
        ghost.prepare_job_execution(job)
        time.sleep(TIMEOUT)  # the run expires in RQ's registry
        rq.queue.started_job_registry.cleanup()  # as a tool would: no handler of ours
        assert not rq.run_pending(job_id, 0)
        assert service.jobs.store.get(job_id).state == JobState.QUEUED
        workers.start("survivor")
        deadline = time.monotonic() + 120
        while (answer := client.get(job_url).get_json())["state"] != "done":
            assert answer["state"] in ("queued", "running"), answer
            assert time.monotonic() < deadline, answer
            time.sleep(0.1)
        assert service.jobs.store.get(job_id).attempts == 2
    finally:
        ghost.register_death()
        workers.stop()


@pytest.mark.redis
@pytest.mark.server
@pytest.mark.browser
def test_in_chromium_the_form_says_no_worker_then_a_started_worker_does_the_job(
        redis_server, models_dir, tmp_path):
    """The page's script (animegan.js) against gunicorn on Redis with no worker: its job
    panel says no worker runs, then shows the result once one is started."""
    from conftest import need
    from servers import Server
    from test_browser import CHROMEDRIVER, CHROMIUM, start_server

    need(CHROMIUM is not None and CHROMEDRIVER is not None, "needs chromium and chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    server: Server = start_server(tmp_path, models_dir, ANIMEGAN_STORAGE_URI=redis_server.uri,
                                  ANIMEGAN_JOB_WORKER_TIMEOUT=str(TIMEOUT),
                                  ANIMEGAN_MAX_SIDE="128", FLASK_SECRET_KEY=SECRET)
    env = worker_env(tmp_path / "models", redis_server.uri, TIMEOUT)  # the server's styles
    workers = Workers({**env, "ANIMEGAN_DEFAULT_STYLE": "toon_demo"}, tmp_path)
    gif = tmp_path / "chelsea.gif"
    gif.write_bytes(gif_from_photos(8, size=(128, 96)))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1000,900"):
        options.add_argument(flag)
    os.environ.setdefault("SE_OFFLINE", "true")
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        driver.get(f"{server.url}/animegan/")
        driver.find_element("id", "animegan-image").send_keys(str(gif))
        driver.find_element("id", "animegan-submit").click()
        sent = time.monotonic()

        def status() -> str:
            return driver.find_element("id", "animegan-job-status").text

        while "No worker is running" not in status():
            assert time.monotonic() - sent < TIMEOUT + 15, status()
            time.sleep(0.2)
        noticed = time.monotonic() - sent
        assert status() == "No worker is running: the site's administrator has been told."
        driver.execute_script("arguments[0].scrollIntoView()",
                              driver.find_element("id", "animegan-job-panel"))
        driver.save_screenshot(str(tmp_path / "no-worker-form.png"))
        print(f"the form's job panel said 'no worker' {noticed:.1f} s after the upload; "
              f"screenshot: {tmp_path / 'no-worker-form.png'}")
        workers.start("late")
        deadline = time.monotonic() + 180
        while (state := driver.execute_script(
                "return document.getElementById('animegan-job-panel').dataset.state")) in (
                    "queued", "running"):
            assert time.monotonic() < deadline, status()
            time.sleep(0.2)
        assert state == "done" and "Done: 8 of 8 frames" in status(), status()
    finally:
        driver.quit()
        workers.stop()
        server.stop()
