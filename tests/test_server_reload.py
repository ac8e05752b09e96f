"""Reloads keep serving, and the access logs never hold a result token: through the real
gunicorn with the shipped gunicorn.conf.py, alone and behind nginx running deploy/nginx.conf
(only its ports and log path changed).

A reload is gunicorn's HUP (the unit's ExecReload). The old worker must keep answering
until the new one has warmed up, then hand over; a new worker that never gets ready must
leave the old one serving. ``watch_reload`` records every answer over the window after the
HUP; ``python tests/test_server_reload.py`` prints the same figures for docs/deployment.md.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from conftest import photo_bytes
from requests.adapters import HTTPAdapter
from servers import NginxServer, Server

from bench.servers import GunicornServer

pytestmark = pytest.mark.server

PHOTO = photo_bytes("coffee")
WINDOW = 60.0  # seconds watched after the HUP
PROMPT = 2.0  # every probe, and every 503, within this


def instance_env(models_dir: Path, **extra: str) -> dict[str, str]:
    """An instance as deploy/README.md sets one up (behind one proxy), with settings that
    keep conversions short (128 px, one torch thread) and no rate limit."""
    return {
        "FLASK_SECRET_KEY": "one key for every instance",
        "ANIMEGAN_TRUSTED_PROXIES": "1",
        "ANIMEGAN_RATE_LIMIT": "",
        "ANIMEGAN_TORCH_THREADS": "1",
        "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_DEFAULT_STYLE": "test_style",
        "ANIMEGAN_MAX_SIDE": "128",
        "ANIMEGAN_PRECISION": "fp32",
        "ANIMEGAN_WARMUP_SIZE": "64",
        "ANIMEGAN_SAMPLE_SIZE": "0",
        "ANIMEGAN_ACCESS_LOG": "",
        **extra,
    }


_addresses = iter(f"127.0.{n // 200 + 60}.{n % 200 + 10}" for n in range(10**6))
_address_lock = threading.Lock()


class _FromAddress(HTTPAdapter):
    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


def client() -> requests.Session:
    """A visitor at a loopback address of its own (nginx's per-address edge limit)."""
    with _address_lock:
        address = next(_addresses)
    session = requests.Session()
    session.mount("http://", _FromAddress(address))
    return session


def master_children(server: Server) -> list[int]:
    assert server.process is not None
    pid = server.process.pid
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# --- watching a reload ------------------------------------------------------------------------

@dataclass
class Answer:
    began: float  # seconds after the HUP (negative: before it)
    seconds: float
    status: int | None  # None: no answer (connection error or our timeout)
    pid: int | None = None  # the worker that answered a probe


@dataclass
class Watch:
    probes: list[Answer] = field(default_factory=list)
    conversions: list[Answer] = field(default_factory=list)

    def silence(self) -> float:
        """The longest stretch after the HUP in which no probe got its 200."""
        ends = [0.0] + sorted(a.began + a.seconds for a in self.probes if a.status == 200)
        ends.append(max(a.began + a.seconds for a in self.probes))
        return max(b - a for a, b in itertools.pairwise(ends))

    def handover(self) -> float | None:
        """When a probe was first answered by another worker than the first probe."""
        first = self.probes[0].pid
        return next((a.began for a in self.probes if a.pid not in (None, first)), None)

    def summary(self) -> str:
        slow = max(a.seconds for a in self.probes)
        handover = self.handover()
        statuses = sorted({a.status for a in self.conversions}, key=str)
        return (f"{len(self.probes)} probes, slowest {slow:.2f} s, longest silence "
                f"{self.silence():.2f} s, new worker answering from "
                f"{'never' if handover is None else f'{handover:.1f} s'}; "
                f"{len(self.conversions)} conversions, statuses "
                f"{statuses}, slowest 503 "
                f"{max([a.seconds for a in self.conversions if a.status == 503] or [0]):.2f} s")


def watch_reload(url: str, hup: Callable[[], None], window: float = WINDOW,
                 converters: int = 3, until: Callable[[], bool] | None = None,
                 at_least: float = 10) -> Watch:
    """``converters`` clients convert PHOTO at ``url`` in a loop; once they have had an
    answer, ``hup()``; then /animegan/healthz is probed every 0.25 s for ``window``
    seconds (or until ``until()`` holds, after at least ``at_least`` seconds)."""
    watch = Watch()
    stop = threading.Event()
    started: list[float] = []

    def convert() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                response = client().post(f"{url}/animegan/convert", data=PHOTO, timeout=90,
                                         headers={"Content-Type": "image/jpeg"})
                status: int | None = response.status_code
            except requests.RequestException:
                status = None
            hup_at = started[0] if started else began
            watch.conversions.append(Answer(began - hup_at, time.monotonic() - began, status))
            if status != 200:
                time.sleep(0.25)

    threads = [threading.Thread(target=convert, daemon=True) for _ in range(converters)]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(watch.conversions) >= converters, 60, "the first conversions")
    started.append(time.monotonic())
    hup()
    try:
        while time.monotonic() - started[0] < window:
            began = time.monotonic()
            try:
                response = requests.get(f"{url}/animegan/healthz", timeout=PROMPT * 5)
                status, pid = response.status_code, response.json().get("pid")
            except (requests.RequestException, ValueError):
                status, pid = None, None
            watch.probes.append(Answer(began - started[0], time.monotonic() - began, status, pid))
            if until is not None and began - started[0] > at_least and until():
                break
            time.sleep(max(0.0, 0.25 - (time.monotonic() - began)))
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    return watch


def assert_kept_serving(watch: Watch) -> None:
    late = [a for a in watch.probes if a.status != 200 or a.seconds > PROMPT]
    assert not late, f"probes without a prompt 200: {late[:5]} ({watch.summary()})"
    during = [a for a in watch.conversions if a.began >= 0]
    assert during, "no conversion ran during the reload"
    bad = [a for a in during
           if not (a.status == 200 or (a.status == 503 and a.seconds <= PROMPT))]
    assert not bad, f"conversions neither 200 nor a prompt 503: {bad[:5]} ({watch.summary()})"
    assert any(a.status == 200 for a in during), watch.summary()


def hup(server: Server) -> Callable[[], None]:
    assert server.process is not None
    return lambda: os.kill(server.process.pid, signal.SIGHUP)


# --- one instance ------------------------------------------------------------------------------

@pytest.fixture
def instance(models_dir, tmp_path) -> Iterator[Server]:
    """An instance of its own (the tests reload it), pinned to nothing."""
    with Server(instance_env(models_dir), log=tmp_path / "gunicorn.log") as server:
        yield server


def test_a_reload_under_load_keeps_answering_and_hands_over(instance):
    """HUP while 3 clients convert: for the 60 s after it every /healthz probe gets 200
    within 2 s, conversions get 200 or a prompt 503, and the new worker takes over: the
    old worker exits, and only then does another pid answer."""
    old = master_children(instance)
    assert len(old) == 1

    def handed_over() -> bool:
        now = master_children(instance)
        return len(now) == 1 and now != old

    watch = watch_reload(instance.url, hup(instance))
    print(f"\nreload, one instance: {watch.summary()}")
    assert_kept_serving(watch)
    wait_until(handed_over, 30, "the old worker to exit")
    assert not Path(f"/proc/{old[0]}").exists()
    new = master_children(instance)[0]
    served_by = [a.pid for a in watch.probes]
    assert served_by[0] == old[0] and served_by[-1] == new, served_by
    # the old worker answered until the handover, then only the new one
    assert served_by == sorted(served_by, key=lambda pid: pid == new)
    instance.wait_for_output(rf"new worker {new} is ready; old worker\(s\) {old[0]} stop")
    assert "Traceback" not in instance.output()


# Ways a new worker never gets ready: the old one must keep serving, and stay the one worker.

def break_the_app(server: Server, models: Path, marker: Path) -> None:
    marker.touch()  # tests/reload_app.py: the next import of the app fails


def break_the_weights(server: Server, models: Path, marker: Path) -> None:
    (models / "test_style.pt").write_bytes(b"not a state dict")


def kill_the_new_worker(server: Server, models: Path, marker: Path) -> None:
    """As the kernel's OOM killer would, while the new worker warms up."""
    old = set(master_children(server))
    wait_until(lambda: set(master_children(server)) - old, 10, "the new worker")
    (new,) = set(master_children(server)) - old
    time.sleep(0.5)  # it has just forked: importing torch alone takes longer than this
    os.kill(new, signal.SIGKILL)


FAILURES = {
    "the app no longer imports": (break_the_app, "it could not load the app"),
    "the default style's weights are broken": (break_the_weights,
                                                "its default style is not usable"),
    "the new worker is killed while warming up": (kill_the_new_worker,
                                                  r"exited before it was ready"),
}

RELOAD_APP = '''
import os
if os.path.exists(os.environ["RELOAD_TEST_BREAK"]):
    raise RuntimeError("this deploy is broken")
from example_app import app  # noqa: E402,F401
'''


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_new_worker_that_never_gets_ready_leaves_the_old_one_serving(
        failure, models_dir, tmp_path):
    breaks, reason = FAILURES[failure]
    models = tmp_path / "models"
    shutil.copytree(models_dir, models)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "reload_app.py").write_text(RELOAD_APP)
    marker = tmp_path / "broken"
    # gunicorn's master waits up to the graceful timeout for the old workers to exit after
    # a HUP, starting no worker meanwhile; a short one lets the test see what it does next
    env = instance_env(models, PYTHONPATH=f"{tmp_path / 'app'}:{os.environ.get('PYTHONPATH', '')}",
                       RELOAD_TEST_BREAK=str(marker), GUNICORN_CMD_ARGS="--graceful-timeout 10")
    server = Server(env, log=tmp_path / "gunicorn.log", app="reload_app:app")
    with server:
        (old,) = master_children(server)

        def reload() -> None:
            if breaks is not kill_the_new_worker:
                breaks(server, models, marker)
            os.kill(server.process.pid, signal.SIGHUP)
            if breaks is kill_the_new_worker:
                breaks(server, models, marker)

        watch = watch_reload(server.url, reload, window=40, at_least=15,
                             until=lambda: "keep serving" in server.output())
        print(f"\n{failure}: {watch.summary()}")
        server.wait_for_output(reason, timeout=30)
        server.wait_for_output(rf"old worker\(s\) {old} keep serving", timeout=30)
        assert_kept_serving(watch)
        assert {a.pid for a in watch.probes} == {old}
        # the new worker has said why and exits (its teardown can take seconds on a busy
        # machine); then, past the graceful timeout, gunicorn's 1 s loop starts no other
        wait_until(lambda: master_children(server) == [old], 30, "the new worker to exit")
        time.sleep(2)
        assert master_children(server) == [old], "the old worker alone should remain"
        assert client().post(f"{server.url}/animegan/convert", data=PHOTO, timeout=60,
                             headers={"Content-Type": "image/jpeg"}).status_code == 200
        assert "Shutting down" not in server.output()


def test_a_worker_that_stops_mid_job_exits_cleanly(models_dir, tmp_path):
    """SIGTERM (systemd's stop) while the local queue converts a long GIF: the worker stops
    the job at a frame and exits, where it used to die at exit inside the network (gunicorn:
    "Worker (pid:N) was sent SIGABRT!")."""
    from media import gif_from_photos

    server = Server(instance_env(models_dir), log=tmp_path / "gunicorn.log")
    with server:
        visitor = client()
        created = visitor.post(f"{server.url}/animegan/jobs", data=gif_from_photos(300),
                               headers={"Content-Type": "image/gif"}, timeout=60)
        assert created.status_code == 202, created.text
        url = f"{server.url}{created.headers['Location']}"
        wait_until(lambda: visitor.get(url, timeout=10).json()["frames_done"] >= 3, 60,
                   "the job to convert its first frames")
        os.kill(server.process.pid, signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0, server.log_tail()
    assert "because this process is exiting" in server.output(), server.log_tail()
    assert "SIGABRT" not in server.output() and "terminate called" not in server.output()


def test_a_worker_stopped_while_it_warms_up_exits_cleanly(models_dir, tmp_path):
    """SIGTERM while the first worker warms up in the background (backend and precision
    timed, as by default): it finishes the warm-up (at most WARM_UP_EXIT_WAIT) and exits,
    where it used to die at exit inside the network ("was sent SIGABRT!")."""
    env = instance_env(models_dir, ANIMEGAN_BACKEND="auto", ANIMEGAN_PRECISION="auto",
                       ANIMEGAN_WARMUP_SIZE="384")
    # the page answers while the worker warms up; /healthz says "warming" (503)
    server = GunicornServer("warming", ["-c", "gunicorn.conf.py", "example_app:app"], env,
                            tmp_path, ready_path="/animegan/", ready_timeout=90)
    with server:
        health = requests.get(f"{server.url}/animegan/healthz", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "warming", health.text
        os.kill(server.process.pid, signal.SIGTERM)
        assert server.process.wait(timeout=90) == 0, server.log_tail()
    log = server.output()
    assert "SIGABRT" not in log and "terminate called" not in log, log[-3000:]
    assert "warmed up in" in log, log[-3000:]
    assert log.index("Handling signal: term") < log.index("warmed up in"), log[-3000:]


# --- behind nginx -----------------------------------------------------------------------------

def conversions_logged(server: Server) -> int:
    return server.output().count('animegan.conversion {"cache"')


@pytest.mark.nginx
def test_behind_nginx_a_reload_costs_no_request_and_the_other_instance_serves(
        models_dir, tmp_path):
    """Two instances behind deploy/nginx.conf; HUP one while 3 clients convert: every
    answer through nginx is 200, 429 or 503 (none later than 2 s for /healthz), and the
    other instance converts meanwhile."""
    env = instance_env(models_dir)
    with Server(env, log=tmp_path / "a.log") as a, Server(env, log=tmp_path / "b.log") as b:
        (tmp_path / "nginx").mkdir()
        with NginxServer(tmp_path / "nginx", [a.port, b.port]) as nginx:
            (old,) = master_children(a)
            b_before = conversions_logged(b)
            watch = watch_reload(nginx.url, hup(a),
                                 until=lambda: master_children(a) not in ([], [old]))
            print(f"\nreload behind nginx: {watch.summary()}")
            slow = [p for p in watch.probes if p.seconds > PROMPT or p.status != 200]
            assert not slow, (slow[:5], watch.summary())
            statuses = {c.status for c in watch.conversions}
            assert statuses <= {200, 429, 503}, watch.summary()
            assert conversions_logged(b) > b_before, "the other instance converted nothing"
            wait_until(lambda: len(master_children(a)) == 1 and master_children(a) != [old],
                       60, "the reloaded instance's handover")
            assert "upstream prematurely closed" not in nginx.error_log()


# --- access logs ------------------------------------------------------------------------------

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def visit_a_result_page(url: str) -> str:
    """What a browser does with the form: load the page, post a photo, follow the 303 to
    the result page (sending the page it came from as Referer), load its two images
    (with the result page as Referer) and the download link. Returns the token."""
    session = client()
    page = session.get(f"{url}/animegan/", timeout=30)
    token = CSRF_FIELD.search(page.text).group(1)
    posted = session.post(f"{url}/animegan/upload", timeout=60, allow_redirects=False,
                          headers={"Referer": f"{url}/animegan/"},
                          data={"csrf_token": token},
                          files={"image": ("photo.jpg", PHOTO, "image/jpeg")})
    assert posted.status_code == 303, posted.text[:300]
    location = posted.headers["Location"]
    result_token = re.fullmatch(r"/animegan/result/([^/?#]+)", location).group(1)
    result = session.get(url + location, timeout=30, headers={"Referer": f"{url}/animegan/"})
    assert result.status_code == 200
    images = set(re.findall(r'(?:src|href)="(/animegan/result/[^"]+)"', result.text))
    assert {f"{location}/anime", f"{location}/original"} <= {i.split("?")[0] for i in images}
    for image in images:
        answer = session.get(url + image.replace("&amp;", "&"), timeout=30,
                             headers={"Referer": url + location})
        assert answer.status_code == 200
    return result_token


def test_gunicorn_access_log_never_holds_a_result_token(models_dir, tmp_path):
    env = instance_env(models_dir, ANIMEGAN_ACCESS_LOG="-")
    with Server(env, log=tmp_path / "gunicorn.log") as server:
        token = visit_a_result_page(server.url)
        server.wait_for_output(r'"GET /animegan/result/<redacted>/anime HTTP/1.1" 200.*'
                               r'"http://[^"]+/animegan/result/<redacted>"')
        log = server.output()
    assert log.count("/result/<redacted>") >= 4, log[-2000:]
    assert token not in log


@pytest.mark.nginx
def test_nginx_access_log_never_holds_a_result_token(models_dir, tmp_path):
    env = instance_env(models_dir, ANIMEGAN_ACCESS_LOG="-")
    with Server(env, log=tmp_path / "gunicorn.log") as server:
        (tmp_path / "nginx").mkdir()
        with NginxServer(tmp_path / "nginx", [server.port]) as nginx:
            token = visit_a_result_page(nginx.url)
            access = tmp_path / "nginx" / "access.log"
            wait_until(lambda: access.exists() and "/anime HTTP" in access.read_text(), 10,
                       "nginx's access log")
            logs = {"nginx": access.read_text(), "gunicorn": server.output()}
    for name, log in logs.items():
        assert "/result/<redacted>" in log, (name, log[-2000:])
        assert token not in log, name
    assert re.search(r'"GET /animegan/result/<redacted>/anime HTTP/1.1" 200 \d+ '
                     r'"http://[^"]+/animegan/result/<redacted>"', logs["nginx"]), logs["nginx"]
