"""Jobs on RQ: a real redis-server and two real ``flask animegan worker`` processes.

The app in this process takes the jobs as the web process would (``service.jobs``, on the
same Redis) and reads them back; the workers convert them. A worker killed mid-job leaves
its job running without reports: the other worker's sweep requeues it and ends it, with no
client reading it (the records are read straight from storage, which settles nothing).
"""

from __future__ import annotations

import io
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from media import gif_from_photos
from PIL import Image

from flask_animegan.config import JOB_STALL_SECONDS
from flask_animegan.jobs.queues import RQQueue
from flask_animegan.jobs.records import JobRecord, JobState

pytestmark = [pytest.mark.redis, pytest.mark.server]

REPO = Path(__file__).resolve().parent.parent
STALL_SECONDS = JOB_STALL_SECONDS
SECRET = "jobs-rq-test-secret"


def worker_env(models_dir: Path, redis_uri: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("ANIMEGAN_")}
    env.update({
        "PYTHONPATH": str(REPO), "FLASK_SECRET_KEY": SECRET,
        "ANIMEGAN_STORAGE_URI": redis_uri, "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_SHIPPED_STYLES": "false", "ANIMEGAN_BACKEND": "torch",
        "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_WARMUP_SIZE": "32",
        "ANIMEGAN_SAMPLE_SIZE": "0", "ANIMEGAN_MAX_SIDE": "128",
        "ANIMEGAN_TORCH_THREADS": "1",
    })
    return env


@pytest.fixture
def workers(redis_server, models_dir, tmp_path):
    """Two ``flask animegan worker`` processes, named w0 and w1, stopped at the end."""
    env = worker_env(models_dir, redis_server.uri)
    started = {}
    for name in ("w0", "w1"):
        with (tmp_path / f"{name}.log").open("wb") as log:
            started[name] = subprocess.Popen(
                [sys.executable, "-m", "flask", "--app", "example_app", "animegan", "worker",
                 "--name", name], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    yield started
    for process in started.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for name, process in started.items():
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for name in started:
        print(f"--- {name}.log\n{(tmp_path / f'{name}.log').read_text()[-3000:]}")


@pytest.fixture
def service(make_app, redis_server):
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, SECRET_KEY=SECRET)
    service = app.extensions["animegan"]
    assert isinstance(service.jobs.queue, RQQueue)
    return service


def wait_for_workers(service, count: int = 2, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.jobs.status().get("workers", 0) >= count:
            return
        time.sleep(0.2)
    pytest.fail(f"{count} RQ workers did not register within {timeout} s")


def submit(service, data: bytes, client: str = "127.0.0.1") -> JobRecord:
    info = service.jobs.probe(data)
    return service.jobs.submit(data, info, style="test_style", size=128, client=client)


def watch(service, job_id: str, until, timeout: float) -> list[tuple[float, JobRecord]]:
    """(time, record) read every 50 ms until ``until(record)``."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = service.jobs.get(job_id)
        assert record is not None
        seen.append((time.monotonic(), record))
        if until(record):
            return seen
        time.sleep(0.05)
    pytest.fail(f"job {job_id} still {seen[-1][1].state} after {timeout} s: {seen[-1][1]}")


def test_two_workers_convert_a_60_frame_gif_reporting_every_2_s(service, workers):
    wait_for_workers(service)
    durations = [60 + 20 * (i % 4) for i in range(60)]
    data = gif_from_photos(60, size=(128, 96), durations=durations)
    record = submit(service, data)
    seen = watch(service, record.id, lambda r: r.finished, timeout=300)
    final = seen[-1][1]
    assert final.state == JobState.DONE, final.error
    assert final.frames_done == 60 and final.attempts == 1

    running = [(at, r) for at, r in seen if r.state == JobState.RUNNING]
    assert running, "the job was never seen running"
    # a report (the record's heartbeat) at least every 2 s while it ran
    beats = sorted({r.updated_at for _, r in running} | {final.updated_at})
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps, default=0) <= 2.0, f"longest gap between reports: {max(gaps):.2f} s"
    print(f"60 frames in {final.finished_at - final.started_at:.1f} s, {len(beats)} reports, "
          f"longest gap {max(gaps, default=0):.2f} s")
    done = [r.frames_done for _, r in seen]
    assert done == sorted(done) and len(set(done)) > 3, set(done)

    result = service.jobs.store.get_result(record.id)
    with Image.open(io.BytesIO(result)) as gif:
        assert gif.n_frames == 60
        got = []
        for index in range(60):
            gif.seek(index)
            got.append(gif.info["duration"])
    assert got == durations


def test_a_worker_killed_mid_job_leaves_it_finished_within_30_s(service, workers):
    from rq.job import Job

    wait_for_workers(service)
    record = submit(service, gif_from_photos(60, size=(128, 96)))
    watch(service, record.id, lambda r: r.state == JobState.RUNNING and r.frames_done >= 5,
          timeout=120)
    job = Job.fetch(RQQueue.rq_id(record.id, 0), connection=service.jobs.queue.connection)
    victim = job.worker_name
    assert victim in workers, victim
    workers[victim].send_signal(signal.SIGKILL)
    workers[victim].wait(timeout=10)
    killed = time.monotonic()

    # nobody reads the job through Jobs.get: the surviving worker's sweep settles it
    requeued_at = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        final = service.jobs.store.get(record.id)
        if requeued_at is None and (final.state == JobState.QUEUED or final.attempts == 2):
            requeued_at = time.monotonic()
        if final.finished:
            break
        time.sleep(0.05)
    ended_at = time.monotonic()
    assert final.finished, f"still {final.state} in storage 60 s after the kill: {final}"
    assert ended_at - killed <= 30, f"ended {ended_at - killed:.1f} s after the kill"
    assert final.state in (JobState.DONE, JobState.FAILED)
    settled = f"{requeued_at - killed:.1f} s" if requeued_at else "unseen"
    print(f"killed {victim}; requeued {settled} after the kill (stall {STALL_SECONDS} s + "
          f"sweep {STALL_SECONDS / 4} s), ended {final.state.value} "
          f"{ended_at - killed:.1f} s after it, attempts {final.attempts}")
    if final.state == JobState.DONE:
        assert final.attempts == 2 and final.frames_done == 60
        with Image.open(io.BytesIO(service.jobs.store.get_result(record.id))) as gif:
            assert gif.n_frames == 60


def test_a_job_stalled_twice_is_failed_by_a_workers_sweep(service, workers):
    """A second stall (as a second killed worker leaves it): a worker's sweep marks it
    failed within the stall time and a sweep period, read by nobody."""
    from flask_animegan.jobs.work import STALLED

    wait_for_workers(service)
    data = gif_from_photos(6, size=(128, 96))
    info = service.jobs.probe(data)
    record = service.jobs.store.create(data, client="127.0.0.1", style="test_style",
                                       size=128, kind=info.kind, format=info.format,
                                       frames_total=info.frames)
    record.state, record.attempts, record.frames_done = JobState.RUNNING, 2, 3
    record.lost_runs = 1  # its first run was lost before it finished a segment too
    record.updated_at = time.time()  # its worker's last report: it dies now
    service.jobs.store.start(record)
    deadline = time.monotonic() + 60
    while not (final := service.jobs.store.get(record.id)).finished:
        assert time.monotonic() < deadline, f"still {final.state} in storage: {final}"
        time.sleep(0.05)
    took = time.time() - record.updated_at
    print(f"failed by a sweep {took:.2f} s after the last report")
    assert final.state == JobState.FAILED and final.error == STALLED
    assert took <= STALL_SECONDS + STALL_SECONDS / 4 + 10
    assert service.jobs.store.get_input(record.id) is None
    # the sweeper claimed that step on the shared Redis (SET NX): nobody else settles it
    assert not service.jobs.store.claim(record.id, "settle-2", 60)
    assert service.jobs.store.claim(record.id, "settle-3", 60)
