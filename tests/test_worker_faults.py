"""Jobs through Redis and worker faults: while the jobs' Redis is out the job routes answer
503 with Retry-After and say the job is kept; a worker waits for Redis and goes on in the
same process; a SIGKILLed worker started again under its name converts; the MP4s of dead
runs are swept when a worker starts.

"Killed" is SIGKILL: the Redis here keeps its data (append-only file, fsync on each write),
as a jobs' Redis must for a job to outlive a crash of it; the shipped deploy/redis.conf
keeps none, so there a restart loses the jobs (their clients get 404 and send again)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from media import gif_from_photos
from servers import RedisServer
from test_jobs_api import post_job
from test_jobs_workers import Workers, redis_app, wait_for_state, worker_env

from flask_animegan.jobs.records import JobState
from flask_animegan.outputs.animations import sweep_leftovers

KEPT = "the job is kept"


class KeptRedis(RedisServer):
    """A redis-server that keeps its data across a SIGKILL and a start on the same port."""

    def config(self) -> str:
        return super().config().replace("appendonly no", "appendonly yes\nappendfsync always")


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_sweep_deletes_the_mp4s_of_dead_runs_and_old_ones_only(tmp_path):
    dead = tmp_path / f"animegan-{dead_pid()}-abc.mp4"
    ours = tmp_path / f"animegan-{os.getpid()}-def.mp4"
    old = tmp_path / "animegan-ghi.mp4"  # no pid in its name: age decides
    young = tmp_path / "animegan-jkl.mp4"
    other = tmp_path / f"other-{dead_pid()}-x.mp4"
    for path in (dead, ours, old, young, other):
        path.write_bytes(b"\0" * 16)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sweep_leftovers(3600, str(tmp_path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [ours.name, young.name, other.name])


@pytest.fixture
def kept_redis(tmp_path_factory):
    server = KeptRedis(tmp_path_factory.mktemp("kept-redis"))
    yield server
    server.stop()


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.1)
    return result


@pytest.mark.redis
@pytest.mark.server
def test_jobs_answer_503_while_redis_is_killed_and_the_same_worker_goes_on_after(
        make_app, kept_redis, models_dir, tmp_path):
    app = redis_app(make_app, kept_redis, 10)
    service = app.extensions["animegan"]
    client = app.test_client()
    workers = Workers(worker_env(models_dir, kept_redis.uri, 10), tmp_path)
    gif = gif_from_photos(8, size=(128, 96))
    try:
        worker = workers.start("steady")
        done = post_job(client, gif, size="128").get_json()
        assert wait_for_state(service, done["id"], lambda r: r.finished, 180).state == JobState.DONE
        # a longer job, running when Redis dies
        long = post_job(client, gif_from_photos(120, size=(128, 96)), "raw",
                        size="128").get_json()
        wait_for_state(service, long["id"], lambda r: r.frames_done >= 1, 60)
        kept_redis.kill()
        killed = time.monotonic()
        for _ in range(10):
            refused = post_job(client, gif, size="128")
            assert refused.status_code == 503, refused.get_json()
            assert int(refused.headers["Retry-After"]) > 0
        for method, url in [("get", done["url"]), ("delete", done["url"]),
                            ("get", done["url"] + "/result"), ("get", done["page_url"]),
                            ("get", long["url"]), ("delete", long["url"])]:
            answer = getattr(client, method)(url)
            assert answer.status_code == 503, (method, url, answer.status_code)
            assert int(answer.headers["Retry-After"]) > 0
            assert KEPT in answer.get_data(as_text=True), answer.get_data(as_text=True)
        time.sleep(max(0.0, 8 - (time.monotonic() - killed)))  # the worker meets the fault
        assert worker.poll() is None, "the worker exited while Redis was out"
        kept_redis.start()
        back = time.monotonic()
        readable = wait_until(lambda: client.get(done["url"]).status_code == 200, 30,
                              "the job readable again")
        assert readable and client.get(done["url"]).get_json()["state"] == "done"
        assert client.get(done["url"] + "/result").status_code == 200
        after = post_job(client, gif, size="128")
        assert after.status_code == 202, after.get_json()
        record = wait_for_state(service, after.get_json()["id"], lambda r: r.finished, 240)
        assert record.state == JobState.DONE, record.error
        assert worker.poll() is None  # the same process, never restarted
        print(f"redis out {back - killed:.1f} s; a new job done {time.monotonic() - back:.1f} s"
              " after it came back, by the same worker process")
    finally:
        workers.stop()
    # RQ's worker quit on the fault, and this process started it again
    assert "it starts again once Redis answers" in (tmp_path / "steady.log").read_text()


@pytest.mark.redis
@pytest.mark.server
def test_a_sigkilled_worker_started_again_under_its_name_converts_and_sweeps(
        make_app, redis_server, models_dir, tmp_path):
    app = redis_app(make_app, redis_server, 10)
    service = app.extensions["animegan"]
    client = app.test_client()
    env = worker_env(models_dir, redis_server.uri, 10)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env["TMPDIR"] = str(temp)
    workers = Workers(env, tmp_path)
    gif = gif_from_photos(8, size=(128, 96))
    times = []
    try:
        for round in range(2):
            started = time.monotonic()
            worker = workers.start("host-1")  # the unit's --name %H-%i
            job = post_job(client, gif, size="128").get_json()
            record = wait_for_state(service, job["id"], lambda r: r.finished, 240)
            assert record.state == JobState.DONE, record.error
            assert worker.poll() is None
            times.append(time.monotonic() - started)
            if round == 0:
                leftover = temp / f"animegan-{worker.pid}-dead.mp4"
                leftover.write_bytes(b"\0" * 1024)  # as a run killed mid-write leaves it
                worker.kill()  # as the OOM killer would
                worker.wait()
        assert not leftover.exists(), "the dead run's MP4 was not swept"
        assert "cleared the registration of the dead worker" in (
            tmp_path / "host-1.log").read_text()
        print(f"start to first job done: first start {times[0]:.1f} s, after SIGKILL "
              f"{times[1]:.1f} s (ratio {times[1] / times[0]:.2f})")
        assert times[1] < 3 * times[0] + 30  # within its warm-up time, not after 30 min
    finally:
        workers.stop()


@pytest.mark.redis
def test_a_photo_sent_to_convert_that_becomes_a_job_answers_503_while_redis_is_out(
        make_app, redis_server):
    """POST /convert with a photo that runs in tiles queues a job: 503, not 500, while Redis
    is out; Redis back without its data (the shipped config keeps none), the job is gone: 404."""
    from test_big_photos import LARGEST, TILED, large_photo, post

    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, SECRET_KEY="worker-faults",
                   ANIMEGAN_MAX_OUTPUT_SIDE=LARGEST)
    client = app.test_client()
    queued = post(client, "/animegan/convert", large_photo(), size=TILED)
    assert queued.status_code == 202, queued.get_json()
    redis_server.kill()
    refused = post(client, "/animegan/convert", large_photo(), size=TILED)
    assert refused.status_code == 503, refused.get_json()
    assert int(refused.headers["Retry-After"]) > 0
    answer = client.get(queued.headers["Location"])
    assert answer.status_code == 503 and KEPT in answer.get_json()["error"]
    redis_server.start()
    gone = wait_until(lambda: (r := client.get(queued.headers["Location"])).status_code != 503
                      and r, 30, "Redis answering again")
    assert gone.status_code == 404  # a Redis without persistence lost it: said as it is
