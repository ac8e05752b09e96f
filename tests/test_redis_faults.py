"""Redis faults never cost a request: every store a request touches (the rate-limit counts
before, during and after the view, the cache, the result pages) falls back, each
fallback is logged once per outage, and /healthz says which store is degraded and why.

Fast tests through the Flask test client against a Redis that misbehaves (a socket that
accepts and never answers, a closed port, a real redis-server killed, stopped or full),
then the acceptance tests through the real gunicorn and redis-server: SIGSTOP, SIGKILL
and DEBUG SLEEP around the 0.5 s timeout while clients convert, answered only with 200,
429 or 503.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import pytest
import requests
from PIL import Image
from conftest import convert, photo_bytes
from test_storage import fill, unfill

PHOTO = photo_bytes("coffee")
#: What a fault may answer: a conversion, the limit, or a full queue. Never a 5xx else.
ALLOWED = {200, 429, 503}


def upload(client, **kwargs):
    """The form's POST (no SECRET_KEY in these apps, so no CSRF token)."""
    return client.post("/animegan/upload", data={"image": (io.BytesIO(PHOTO), "p.jpg"),
                                                 "size": "64"},
                       content_type="multipart/form-data", **kwargs)


def assert_answered_directly(page) -> None:
    """The form's answer when the page store cannot keep the page: the page itself (200,
    not a 303 to an id no instance could find), its pictures inline."""
    assert page.status_code == 200, page.get_data()[:300]
    assert page.headers["Cache-Control"] == "private, no-store"
    html = page.get_data(as_text=True)
    assert "could not keep a page" in html and "/animegan/result/" not in html
    sources = re.findall(r'src="data:(image/[a-z]+);base64,([A-Za-z0-9+/=]+)"', html)
    # the result, the photo over it in the comparison, the photo in the folded details
    assert len(sources) == 3
    for _, data in sources:
        assert Image.open(io.BytesIO(base64.b64decode(data))).size == (64, 43)


def log_lines(caplog, *words: str) -> list[str]:
    """The package's log lines with all of ``words``."""
    return [r.getMessage() for r in caplog.records
            if r.name == "flask_animegan" and all(w in r.getMessage() for w in words)]


@contextlib.contextmanager
def silent_redis() -> Iterator[str]:
    """A Redis URI whose server accepts connections and never answers (a hung host)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(64)
        yield f"redis://127.0.0.1:{hole.getsockname()[1]}/0"


@contextlib.contextmanager
def refused_redis() -> Iterator[str]:
    """A Redis URI where nothing listens (a crashed Redis)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"


OUTAGES = {"never answers": silent_redis, "refuses connections": refused_redis}


# --- through the Flask test client ------------------------------------------------------

@pytest.mark.parametrize("outage", OUTAGES, ids=list(OUTAGES))
def test_every_store_falls_back_while_redis_is_out(make_app, outage, caplog):
    """Down from the start, for every store at once: the limit counts in this process,
    the cache is skipped, the form answers with the page itself; each store's outage is
    logged once, and /healthz names all three."""
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    with OUTAGES[outage]() as uri:
        app = make_app(ANIMEGAN_STORAGE_URI=uri, ANIMEGAN_RATE_LIMIT="4 per minute")
        client = app.test_client()
        started = time.monotonic()
        answers = [convert(client, PHOTO, "?size=64") for _ in range(3)]
        page = upload(client)
        refused = convert(client, PHOTO, "?size=64")
        took = time.monotonic() - started
        assert [a.status_code for a in answers] == [200, 200, 200], answers[0].get_data()[:300]
        assert [a.headers["X-RateLimit-Remaining"] for a in answers] == ["3", "2", "1"]
        assert_answered_directly(page)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
        # each store pays one timeout, then skips Redis for its retry wait
        assert took < 20, took
        health = client.get("/animegan/healthz").get_json()
    assert health["status"] == "degraded", health
    storage = health["storage"]
    assert storage["ok"] is False
    assert {name: storage[name]["state"] for name in ("cache", "pages", "rate_limit")} == {
        "cache": "down", "pages": "down", "rate_limit": "down"}, storage
    # the job queue (RQ) sits on the pages' Redis, and says so too
    assert {problem.split(":")[0] for problem in health["problems"]} == {
        "cache", "pages", "rate_limit", "jobs"}, health["problems"]
    assert all("unreachable" in problem for problem in health["problems"])
    # once per store: the cache and the pages share one Redis client, the counts have theirs
    assert len(log_lines(caplog, "flask_animegan: Redis at ", "is unavailable")) == 1
    assert len(log_lines(caplog, "the rate-limit storage at ", "is unavailable")) == 1


@pytest.fixture
def killable_redis(tmp_path_factory):
    """A real redis-server that the test may kill or stop (SIGCONT on the way out)."""
    from servers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    with contextlib.suppress(ProcessLookupError, AttributeError):
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


FAULTS: dict[str, Callable[..., None]] = {
    "killed": lambda redis: redis.kill(),
    "stopped": lambda redis: os.kill(redis.process.pid, signal.SIGSTOP),
}


@pytest.mark.parametrize("endpoint", ["convert", "upload"])
@pytest.mark.parametrize("fault", FAULTS, ids=list(FAULTS))
def test_redis_failing_after_the_limit_check_costs_no_conversion(make_app, killable_redis,
                                                                 fault, endpoint, caplog):
    """A Redis outage mid-request: Redis counted the request before the view, then died or
    stalled; the X-RateLimit-* headers read the window after the view. The conversion
    still answers, with its headers, and the limit goes on in this process."""
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    app = make_app(ANIMEGAN_STORAGE_URI=killable_redis.uri, ANIMEGAN_RATE_LIMIT="3 per minute")
    armed = threading.Event()

    @app.before_request  # registered after flask-limiter's check: runs right after it
    def fail_redis() -> None:
        if armed.is_set():
            armed.clear()
            FAULTS[fault](killable_redis)

    client = app.test_client()
    assert convert(client, PHOTO, "?size=64").status_code == 200  # Redis counts it
    armed.set()
    if endpoint == "convert":
        answer = convert(client, PHOTO, "?size=64")
        assert answer.status_code == 200, answer.get_data()[:500]
    else:
        answer = upload(client)
        assert_answered_directly(answer)
    assert "X-RateLimit-Limit" in answer.headers
    # counted in this process from here on: a fresh window of 3, which the conversion
    # above already takes one of (a limit is taken once the view has converted)
    statuses = [convert(client, PHOTO, "?size=64").status_code for _ in range(3)]
    assert statuses == [200, 200, 429], statuses
    assert len(log_lines(caplog, "the rate-limit storage at ", "is unavailable")) == 1
    assert client.get("/animegan/healthz").get_json()["storage"]["rate_limit"]["state"] == "down"


def test_a_full_redis_is_a_state_of_its_own(make_app, redis_server, caplog):
    """Under noeviction at maxmemory, reads answer and writes are refused: logged once per
    store for the whole episode (not twice per conversion), /healthz degraded with the
    reason, and the next write that succeeds ends it (logged once)."""
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    app = make_app(ANIMEGAN_STORAGE_URI=redis_server.uri, ANIMEGAN_RATE_LIMIT="4 per minute")
    admin = redis_server.client()
    client = app.test_client()
    assert convert(client, PHOTO, "?size=64").headers["X-Cache"] == "MISS"
    fill(admin)
    # the cache still reads (a hit, free), writes nothing; the counts go on in this process
    hit = convert(client, PHOTO, "?size=64")
    assert hit.status_code == 200 and hit.headers["X-Cache"] == "HIT"
    statuses = [convert(client, photo_bytes(name), "?size=64").status_code
                for name in ("chelsea", "rocket", "astronaut", "camera", "moon")]
    assert statuses == [200, 200, 200, 200, 429], statuses
    page = upload(client, environ_base={"REMOTE_ADDR": "127.0.9.1"})  # another client
    assert_answered_directly(page)
    health = client.get("/animegan/healthz").get_json()
    assert health["status"] == "degraded"
    assert {name: health["storage"][name]["state"] for name in ("cache", "rate_limit")} == {
        "cache": "full", "rate_limit": "full"}
    assert any("full" in problem and problem.startswith("rate_limit") for problem in
               health["problems"]), health["problems"]
    assert len(log_lines(caplog, "is full and refuses writes")) == 2  # Redis, the counts
    assert not log_lines(caplog, "is unavailable") and not log_lines(caplog, "takes writes again")

    unfill(admin)
    answer = convert(client, photo_bytes("chelsea"), "?size=64",
                     environ_base={"REMOTE_ADDR": "127.0.9.2"})
    assert answer.status_code == 200 and answer.headers["X-Cache"] == "MISS"
    health = client.get("/animegan/healthz").get_json()
    assert health["status"] == "ok", health
    assert len(log_lines(caplog, "takes writes again")) == 2


# the start-up warning about an evicting Redis for the counts --------------------------------

@pytest.mark.parametrize(("policy", "warned"), [
    ("allkeys-lru", True), ("volatile-ttl", True), ("noeviction", False), ("refused", False)])
def test_an_evicting_redis_for_the_counts_is_named_at_start(make_app, redis_server, policy,
                                                           warned, caplog):
    caplog.set_level(logging.WARNING, logger="flask_animegan")
    admin = redis_server.client()
    uri = redis_server.uri
    if policy == "refused":  # a managed Redis: CONFIG is not for its users
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"],
                          commands=["+@all", "-config"])
        uri = f"redis://app:pw@127.0.0.1:{redis_server.port}/0"
    else:
        admin.config_set("maxmemory-policy", policy)
    make_app(ANIMEGAN_STATE_STORAGE_URI=uri, ANIMEGAN_RATE_LIMIT="5 per minute")
    lines = log_lines(caplog, "the rate-limit storage at ", "maxmemory-policy")
    assert len(lines) == int(warned), lines
    if warned:
        assert policy in lines[0] and "noeviction" in lines[0]
        assert "ANIMEGAN_STATE_STORAGE_URI" in lines[0] and "pw" not in lines[0]


# --- through the real gunicorn and redis-server ---------------------------------------------

_addresses = itertools.count()


def new_address() -> str:
    number = next(_addresses)
    return f"127.0.{number // 200 + 50}.{number % 200 + 10}"


def convert_as(server, address: str, timeout: float = 60) -> int:
    """One conversion from ``address`` (X-Forwarded-For, as nginx sends it): its status."""
    response = requests.post(f"{server.url}/animegan/convert", data=PHOTO, timeout=timeout,
                             headers={"Content-Type": "image/jpeg",
                                      "X-Forwarded-For": address})
    return response.status_code


def health(server) -> dict:
    return requests.get(f"{server.url}/animegan/healthz", timeout=10).json()


def wait_for(server, wanted: str, timeout: float, converting: bool = False) -> dict:
    """/healthz once its status is ``wanted`` (or at ``timeout``); with ``converting``,
    a conversion first each time, as traffic would (a full state ends with a write)."""
    deadline = time.monotonic() + timeout
    while True:
        if converting:
            convert_as(server, new_address())
        state = health(server)
        if state["status"] == wanted or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


class Flood:
    """``threads`` clients converting back to back, each request from a new address."""

    def __init__(self, server, threads: int = 3) -> None:
        self.server = server
        self.statuses: list[int | str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.statuses.append(convert_as(self.server, new_address()))
            except requests.RequestException as error:
                self.statuses.append(type(error).__name__)


def debug_redis(folder: Path):
    """A redis-server as the tests start it, with DEBUG allowed from loopback."""
    from servers import RedisServer

    class DebugRedis(RedisServer):
        def config(self) -> str:
            return super().config() + "enable-debug-command local\n"

    return DebugRedis(folder)


@pytest.fixture(scope="module")
def deployment(models_dir, tmp_path_factory):
    """One gunicorn instance of the example app with every store in one real Redis."""
    from servers import Server

    folder = tmp_path_factory.mktemp("faults")
    redis_server = debug_redis(folder / "redis")
    env = {"ANIMEGAN_STORAGE_URI": redis_server.uri, "ANIMEGAN_RATE_LIMIT": "5 per minute",
           "ANIMEGAN_TRUSTED_PROXIES": "1", "FLASK_SECRET_KEY": "faults",
           "ANIMEGAN_TORCH_THREADS": "1", "ANIMEGAN_MODELS_DIR": str(models_dir),
           "ANIMEGAN_DEFAULT_STYLE": "test_style", "ANIMEGAN_MAX_SIDE": "128",
           "ANIMEGAN_PRECISION": "fp32", "ANIMEGAN_WARMUP_SIZE": "64",
           "ANIMEGAN_SAMPLE_SIZE": "0", "ANIMEGAN_ACCESS_LOG": ""}
    try:
        server = Server(env, log=folder / "gunicorn.log")
    except BaseException:
        redis_server.stop()
        raise
    yield server, redis_server
    server.stop()
    with contextlib.suppress(ProcessLookupError):
        os.kill(redis_server.process.pid, signal.SIGCONT)
    redis_server.stop()


def outage_counts(server) -> tuple[int, int, int, int]:
    """(Redis down, Redis back, counts down, counts back) lines in the instance's log."""
    text = server.output()
    lines = [line for line in text.splitlines() if "flask_animegan: " in line]
    return (sum("Redis at " in line and "is unavailable" in line for line in lines),
            sum("Redis at " in line and "available again" in line for line in lines),
            sum("rate-limit storage at " in line and "is unavailable" in line for line in lines),
            sum("rate-limit storage at " in line and "available again" in line
                for line in lines))


@pytest.mark.server
@pytest.mark.redis
@pytest.mark.parametrize("fault", ["SIGSTOP for 3 s", "SIGKILL"])
def test_a_stopped_or_killed_redis_costs_no_conversion(deployment, fault):
    """3 clients converting while Redis stops answering (SIGSTOP) or dies (SIGKILL): only
    200, 429 or 503; /healthz degraded during, ok after; each store's outage logged
    once; the limit still holds meanwhile, counted by the instance alone."""
    server, redis_server = deployment
    assert wait_for(server, "ok", 20, converting=True)["status"] == "ok"
    before = outage_counts(server)
    try:
        with Flood(server) as flood:
            time.sleep(1.0)
            if fault == "SIGKILL":
                redis_server.kill()
            else:
                os.kill(redis_server.process.pid, signal.SIGSTOP)
            time.sleep(3.0)
            during = health(server)
        # still out: the limit holds, counted by the instance (a client of its own, alone
        # so that no full queue answers it)
        limited = new_address()
        statuses = [convert_as(server, limited) for _ in range(7)]
    finally:
        if fault == "SIGKILL":
            redis_server.start()
        else:
            os.kill(redis_server.process.pid, signal.SIGCONT)
    assert during["status"] == "degraded", during
    assert not during["storage"]["ok"] and during["problems"], during
    assert statuses == [200] * 5 + [429] * 2, statuses
    after = wait_for(server, "ok", 30, converting=True)
    assert after["status"] == "ok", after
    bad = [status for status in flood.statuses if status not in ALLOWED]
    print(f"\n{fault}: {len(flood.statuses)} conversions, statuses "
          f"{sorted(set(map(str, flood.statuses)))}")
    assert not bad and flood.statuses, flood.statuses
    down, back, counts_down, counts_back = (now - was for now, was in
                                            zip(outage_counts(server), before))
    assert (down, back, counts_down, counts_back) == (1, 1, 1, 1), server.log_tail()


@pytest.mark.server
@pytest.mark.redis
@pytest.mark.parametrize("seconds", [0.45, 0.5, 0.55, 1.0])
def test_redis_stalls_around_the_timeout_cost_no_conversion(deployment, seconds):
    """DEBUG SLEEP just under, at and over the 0.5 s timeout, three times while 3 clients
    convert: never a 5xx; every outage that began is logged once and ended once."""
    server, redis_server = deployment
    assert wait_for(server, "ok", 20, converting=True)["status"] == "ok"
    before = outage_counts(server)
    admin = redis_server.client()
    admin.connection_pool.connection_kwargs["socket_timeout"] = seconds + 5
    with Flood(server) as flood:
        for _ in range(3):
            time.sleep(1.0)
            admin.execute_command("DEBUG", "SLEEP", seconds)
        time.sleep(1.0)
    after = wait_for(server, "ok", 30, converting=True)
    assert after["status"] == "ok", after
    bad = [status for status in flood.statuses if status not in ALLOWED]
    print(f"\nDEBUG SLEEP {seconds}: {len(flood.statuses)} conversions, statuses "
          f"{sorted(set(map(str, flood.statuses)))}, outage lines "
          f"{[now - was for now, was in zip(outage_counts(server), before)]}")
    assert not bad and flood.statuses, flood.statuses
    down, back, counts_down, counts_back = (now - was for now, was in
                                            zip(outage_counts(server), before))
    assert down == back <= 3 and counts_down == counts_back <= 3, server.log_tail()
