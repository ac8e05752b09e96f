"""Several instances behind nginx, sharing state through Redis, with real
processes only: gunicorn instances of the example app, a redis-server, and nginx running
the shipped deploy/nginx.conf (only its ports changed).

Two deployments: ``shared`` (two instances, one Redis for the cache, the result pages and
the rate-limit counts) and ``single`` (one instance, ``memory://``); the tests that make
sense for one instance run on both. Each test speaks as clients of its own. Through nginx
a client is a loopback source address of its own (all of 127/8 is loopback), which nginx
forwards as X-Forwarded-For; straight to an instance, the client puts that address in
X-Forwarded-For itself, as nginx would. So rate-limit buckets and cache scopes never leak
from one test into another.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import PHOTOS, encode_image, free_port, photo_bytes
from PIL import Image
from requests.adapters import HTTPAdapter
from servers import NginxServer, RedisServer, Server, Trickle, child_pids

from bench.servers import REPO

pytestmark = [pytest.mark.server, pytest.mark.nginx, pytest.mark.redis]

LIMIT = "5 per minute"
PHOTO = photo_bytes("coffee")
UPLOAD_LIMIT = 16 << 20  # ANIMEGAN_MAX_UPLOAD_BYTES's default, and nginx's client_max_body_size


def instance_env(models_dir: Path, storage_uri: str) -> dict[str, str]:
    """What every instance of a deployment shares (deploy/README.md's environment file),
    plus settings that keep startup and conversions short (128 px, one torch thread)."""
    return {
        "FLASK_SECRET_KEY": "one key for every instance",
        "ANIMEGAN_TRUSTED_PROXIES": "1",
        "ANIMEGAN_STORAGE_URI": storage_uri,
        "ANIMEGAN_RATE_LIMIT": LIMIT,
        "ANIMEGAN_TORCH_THREADS": "1",
        "ANIMEGAN_MODELS_DIR": str(models_dir),
        "ANIMEGAN_DEFAULT_STYLE": "test_style",
        "ANIMEGAN_MAX_SIDE": "128",
        "ANIMEGAN_PRECISION": "fp32",
        "ANIMEGAN_WARMUP_SIZE": "64",
        "ANIMEGAN_SAMPLE_SIZE": "0",
        "ANIMEGAN_ACCESS_LOG": "",
    }


# --- clients --------------------------------------------------------------------------------

_numbers = itertools.count()  # its next() is atomic: Load's threads share it


def next_address() -> str:
    """A loopback address no client of this module has had: 127.0.10.10, 127.0.10.11, ..."""
    number = next(_numbers)
    return f"127.0.{number // 200 + 10}.{number % 200 + 10}"


class _FromAddress(HTTPAdapter):
    """Connections from one local source address."""

    def __init__(self, address: str) -> None:
        self.address = address  # before super().__init__, which makes the pool manager
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, source_address=(self.address, 0), **kwargs)


class Client:
    """One visitor of the site, at a loopback address of its own, with its own cookies."""

    def __init__(self) -> None:
        self.address = next_address()
        self.session = requests.Session()
        self.session.mount("http://", _FromAddress(self.address))

    def request(self, method: str, target: Server | NginxServer, path: str,
                **kwargs) -> requests.Response:
        """One request, redirects not followed; straight to an instance, with the
        X-Forwarded-For that nginx would have sent."""
        headers = kwargs.pop("headers", {})
        if isinstance(target, Server):
            headers = {"X-Forwarded-For": self.address, **headers}
        kwargs.setdefault("timeout", 60)
        return self.session.request(method, target.url + path, headers=headers,
                                    allow_redirects=False, **kwargs)

    def convert(self, target: Server | NginxServer, data: bytes = PHOTO,
                timeout: float = 60) -> requests.Response:
        return self.request("POST", target, "/animegan/convert", data=data, timeout=timeout,
                            headers={"Content-Type": "image/jpeg"})


def distinct_photos(count: int) -> list[bytes]:
    """``count`` different photos, none of them PHOTO, so that each conversion is a miss
    and counts (a photo sent again is a cache hit, which costs nothing)."""
    return [photo_bytes(name) for name in PHOTOS if name != "coffee"][:count]


def timed(call: Callable[[], requests.Response]) -> tuple[requests.Response, float]:
    began = time.monotonic()
    response = call()
    return response, time.monotonic() - began


def conversion_seconds(target: Server | NginxServer, runs: int = 3) -> float:
    """The median time of ``runs`` conversions of PHOTO, each by a new client."""
    seconds = []
    for _ in range(runs):
        response, took = timed(lambda: Client().convert(target, timeout=20))
        assert response.status_code == 200, response.text
        seconds.append(took)
    return statistics.median(seconds)


def conversions_logged(server: Server) -> int:
    """Successful conversions the instance has logged so far."""
    return server.output().count('animegan.conversion {"cache"')


# --- deployments ----------------------------------------------------------------------------

@dataclass
class Deployment:
    instances: list[Server]
    nginx: NginxServer
    redis: RedisServer | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def a(self) -> Server:
        return self.instances[0]

    @property
    def b(self) -> Server:
        """Another instance than ``a`` where there are two; ``a`` itself in ``single``."""
        return self.instances[-1]


def deploy(models_dir: Path, folder: Path, instances: int, with_redis: bool) -> Iterator[Deployment]:
    with contextlib.ExitStack() as stack:
        store = None
        if with_redis:
            store = RedisServer(folder / "redis")
            stack.callback(store.stop)
        env = instance_env(models_dir, store.uri if store else "memory://")
        servers = []
        for index in range(instances):
            servers.append(Server(env, log=folder / f"gunicorn-{index}.log"))
            stack.callback(servers[-1].stop)
        (folder / "nginx").mkdir()
        nginx = NginxServer(folder / "nginx", [server.port for server in servers])
        stack.callback(nginx.stop)
        yield Deployment(servers, nginx, store)


@pytest.fixture(scope="module")
def shared(models_dir, tmp_path_factory) -> Iterator[Deployment]:
    """Two instances and one Redis behind one nginx."""
    folder = tmp_path_factory.mktemp("shared")
    (folder / "redis").mkdir()
    yield from deploy(models_dir, folder, instances=2, with_redis=True)


@pytest.fixture(scope="module")
def single(models_dir, tmp_path_factory) -> Iterator[Deployment]:
    """One instance with memory:// behind nginx."""
    yield from deploy(models_dir, tmp_path_factory.mktemp("single"), instances=1,
                      with_redis=False)


@pytest.fixture(params=["shared", "single"], ids=["2 instances, redis", "1 instance, memory"])
def deployment(request) -> Deployment:
    return request.getfixturevalue(request.param)


# --- (a) one limit for every instance ---------------------------------------------------------

def test_a_limit_of_5_per_minute_holds_across_instances(deployment):
    """12 conversions from one client through nginx: exactly 5 succeed, whichever instance
    each one reached (nginx alternates between idle instances)."""
    before = [conversions_logged(server) for server in deployment.instances]
    client = Client()
    responses = [client.convert(deployment.nginx, data) for data in distinct_photos(12)]
    statuses = [response.status_code for response in responses]
    assert statuses.count(200) == 5 and statuses.count(429) == 7, statuses
    # the app's refusals and nginx's own (past its per-address burst) look alike
    for refused in (r for r in responses if r.status_code == 429):
        assert refused.json()["status"] == 429 and int(refused.headers["Retry-After"]) > 0
    served = [conversions_logged(server) - was
              for server, was in zip(deployment.instances, before)]
    assert all(served), f"every instance should have converted some: {served}"


# --- (b) one cache ---------------------------------------------------------------------------

def test_a_photo_converted_on_one_instance_is_a_hit_on_the_other(deployment):
    client = Client()
    first = client.convert(deployment.a, photo_bytes("astronaut", quality=90))
    copy = client.convert(deployment.b, photo_bytes("astronaut", quality=85))
    assert first.status_code == copy.status_code == 200
    assert (first.headers["X-Cache"], copy.headers["X-Cache"]) == ("MISS", "HIT")
    # still private to its client (ANIMEGAN_CACHE_SCOPE=client)
    stranger = Client().convert(deployment.b, photo_bytes("astronaut", quality=85))
    assert stranger.headers["X-Cache"] == "MISS"


# --- (c) one secret key, one store of result pages --------------------------------------------

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def upload_with_form(client: Client, page_from: Server, post_to: Server) -> requests.Response:
    """What a browser does: load the page (session cookie, CSRF token), post the form."""
    page = client.request("GET", page_from, "/animegan/")
    assert page.status_code == 200
    token = CSRF_FIELD.search(page.text).group(1)
    return client.request("POST", post_to, "/animegan/upload", data={"csrf_token": token},
                          files={"image": ("photo.jpg", photo_bytes("rocket"), "image/jpeg")})


def test_a_form_served_by_one_instance_is_accepted_by_the_other(deployment):
    """Its CSRF token lives in a session cookie signed with the shared FLASK_SECRET_KEY."""
    response = upload_with_form(Client(), page_from=deployment.a, post_to=deployment.b)
    assert response.status_code == 303, response.text[:500]


def test_the_result_page_of_an_upload_on_one_instance_opens_on_the_other(deployment):
    client = Client()
    response = upload_with_form(client, page_from=deployment.a, post_to=deployment.a)
    assert response.status_code == 303, response.text[:500]
    location = response.headers["Location"]
    assert location.startswith("/animegan/result/")
    page = client.request("GET", deployment.b, location)
    assert page.status_code == 200, page.text[:500]
    images = set(re.findall(r'src="(/animegan/result/[^"?]+)"', page.text))
    assert len(images) == 2, images  # the original and the anime picture
    for image in images:
        answer = client.request("GET", deployment.b, image)
        assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("image/")


# --- (d) Redis down --------------------------------------------------------------------------

def storage_health(server: Server) -> dict:
    """The instance's /healthz with details (asked from loopback, no X-Forwarded-For)."""
    return requests.get(f"{server.url}/animegan/healthz", timeout=10).json()


def wait_for_health(server: Server, check: Callable[[dict], bool], timeout: float,
                    converting: bool = False) -> dict:
    """The instance's health once ``check`` passes (or at ``timeout``); with
    ``converting``, a conversion reaches the instance before each look, as traffic would."""
    deadline = time.monotonic() + timeout
    while True:
        if converting:
            Client().convert(server)
        health = storage_health(server)
        if check(health) or time.monotonic() > deadline:
            return health
        time.sleep(0.2)


def test_conversions_go_on_while_redis_is_down_and_the_cache_comes_back(shared):
    assert shared.redis is not None
    for server in shared.instances:  # each has converted this shape once
        Client().convert(server)
    usual = conversion_seconds(shared.nginx)
    shared.redis.kill()
    try:
        # every conversion answered, none waiting seconds for Redis
        for index in range(6):
            target = shared.instances[index % 2]
            response, took = timed(lambda: Client().convert(target))
            assert response.status_code == 200, response.text[:500]
            assert took < 2 * usual + 1.0, f"{took:.2f} s with Redis down, {usual:.2f} s before"
        # the limit still holds, counted by each instance alone
        client = Client()
        statuses = [client.convert(shared.a, data).status_code for data in distinct_photos(7)]
        assert statuses.count(200) == 5 and statuses.count(429) == 2, statuses
        for server in shared.instances:
            health = wait_for_health(server, lambda h: h["status"] == "degraded", timeout=5)
            assert health["status"] == "degraded", health
            assert health["storage"]["ok"] is False, health
            assert {store["state"] for store in (health["storage"]["cache"],
                                                 health["storage"]["rate_limit"])} == {"down"}
    finally:
        shared.redis.start()

    for server in shared.instances:
        health = wait_for_health(server, lambda h: h["status"] == "ok", timeout=20,
                                 converting=True)
        assert health["status"] == "ok" and health["storage"]["ok"] is True, health
    client = Client()
    first = client.convert(shared.a, photo_bytes("chelsea", quality=90))
    copy = client.convert(shared.b, photo_bytes("chelsea", quality=85))
    assert (first.headers["X-Cache"], copy.headers["X-Cache"]) == ("MISS", "HIT")
    # the outage and the recovery are logged once per instance and store (the cache and
    # pages share a line, the counts have theirs)
    for server in shared.instances:
        log = server.output()
        for store in ("flask_animegan: Redis at ", "the rate-limit storage at "):
            lines = [line for line in log.splitlines() if store in line]
            assert sum("is unavailable (" in line for line in lines) == 1, log[-3000:]
            assert sum("is available again" in line for line in lines) == 1, log[-3000:]


# --- (e) an instance dies ----------------------------------------------------------------------

@dataclass
class Outcome:
    started: float
    ended: float | None = None
    status: int | str | None = None  # an HTTP status, or the exception's name


class Load:
    """Threads converting PHOTO through nginx back to back, each time as a new client."""

    def __init__(self, nginx: NginxServer, threads: int) -> None:
        self.nginx = nginx
        self.outcomes: list[Outcome] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def _run(self) -> None:
        while not self.stopping.is_set():
            outcome = Outcome(time.monotonic())
            self.outcomes.append(outcome)
            try:
                outcome.status = Client().convert(self.nginx).status_code
            except requests.RequestException as error:
                outcome.status = error.__class__.__name__
            outcome.ended = time.monotonic()

    def in_flight(self) -> int:
        return sum(outcome.ended is None for outcome in self.outcomes)

    def answered_since(self, moment: float) -> list[Outcome]:
        return [o for o in self.outcomes if o.ended is not None and o.started > moment]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_nginx_keeps_serving_when_an_instance_is_killed(shared, models_dir, tmp_path):
    """SIGKILL a whole instance (master, worker, decode helpers) under load: at most the
    requests in flight at that moment fail (nginx retries them on the other instance,
    so usually none), and every request after it succeeds."""
    doomed = Server(instance_env(models_dir, shared.redis.uri), log=tmp_path / "doomed.log")
    try:
        nginx = NginxServer(tmp_path, [shared.a.port, doomed.port])
        try:
            with Load(nginx, threads=3) as load:
                wait_until(lambda: conversions_logged(doomed) >= 2, 30, "the doomed instance")
                killed_at = time.monotonic()
                in_flight = load.in_flight()
                for pid in [doomed.process.pid, *child_pids(doomed.process.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                wait_until(lambda: len(load.answered_since(killed_at)) >= 8, 60,
                           "answers after the kill")
            failed = [o for o in load.outcomes if o.status != 200]
            after = load.answered_since(killed_at)
            assert [o.status for o in after if o.status != 200] == []
            assert len(failed) <= in_flight, (failed, in_flight)
            print(f"\n{len(load.outcomes)} conversions, {len(failed)} failed, {in_flight} "
                  f"in flight at the kill, {len(after)} answered after it")
            assert requests.get(f"{nginx.url}/animegan/healthz", timeout=10).status_code == 200
        finally:
            nginx.stop()
    finally:
        doomed.stop()


# --- (f) slow clients ---------------------------------------------------------------------------

#: A multipart upload through nginx that never finishes: its head, then zeros.
TRICKLE_HEAD = (
    b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: multipart/form-data; boundary=trickle\r\nContent-Length: 200000\r\n\r\n"
    b'--trickle\r\nContent-Disposition: form-data; name="image"; filename="p.jpg"\r\n'
    b"Content-Type: image/jpeg\r\n\r\n\xff\xd8")


def test_trickling_uploads_do_not_delay_a_conversion_through_nginx(deployment):
    """20 clients trickling uploads (more than the 4 threads of every instance together):
    nginx holds them, so a normal conversion takes no more than twice its usual time."""
    Client().convert(deployment.nginx)  # this shape has run on the instance(s)
    usual = conversion_seconds(deployment.nginx)
    trickles = [Trickle(deployment.nginx.port, TRICKLE_HEAD, b"\x00" * 64, interval=0.5,
                        address=next_address()) for _ in range(20)]
    for trickle in trickles:
        trickle.start()
    try:
        wait_until(lambda: min(t.sent for t in trickles) >= 2, 15, "the trickles")
        during = conversion_seconds(deployment.nginx)
        for server in deployment.instances:
            _, health_s = timed(lambda: requests.get(f"{server.url}/animegan/healthz", timeout=10))
            assert health_s < 1.0
        print(f"\nconversion {usual:.2f} s before, {during:.2f} s during 20 trickles")
        assert during <= 2 * usual + 0.5, (usual, during)
        assert all(t.is_alive() and not t.closed_by_server for t in trickles)
    finally:
        for trickle in trickles:
            trickle.stopping.set()
        for trickle in trickles:
            trickle.join()


# --- what else the shipped nginx site promises ----------------------------------------------------

def answer_to_head(port: int, head: bytes, wait: float = 2.0) -> bytes:
    """What nginx says within ``wait`` seconds to a request head whose body never comes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(head)
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


def test_nginx_refuses_a_body_over_the_apps_limit_before_reading_it(single):
    def head(length: int) -> bytes:
        return (b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                b"Content-Length: %d\r\n\r\n" % length)

    over = answer_to_head(single.nginx.port, head(UPLOAD_LIMIT + 1))
    assert over.startswith(b"HTTP/1.1 413 "), over[:200]
    assert b"application/json" in over and b'"status": 413' in over
    assert answer_to_head(single.nginx.port, head(UPLOAD_LIMIT), wait=1.0) == b""  # waits for it


def test_with_no_instance_up_nginx_answers_503_with_retry_after(tmp_path):
    nginx = NginxServer(tmp_path, [free_port()])  # nothing listens there
    try:
        response = requests.get(f"{nginx.url}/animegan/healthz", timeout=10)
        assert response.status_code == 503 and response.json()["status"] == 503
        assert int(response.headers["Retry-After"]) > 0
    finally:
        nginx.stop()


def test_metrics_through_nginx_only_for_this_host(single):
    """The metrics path reaches the app only from 127.0.0.1 (here: 404, metrics are off)."""
    assert Client().request("GET", single.nginx, "/animegan/metrics").status_code == 403
    assert requests.get(f"{single.nginx.url}/animegan/metrics", timeout=10).status_code == 404


# --- the shipped Redis settings -------------------------------------------------------------------

def test_the_shipped_redis_settings_evict_by_lru_and_keep_nothing_on_disk(tmp_path):
    with RedisServer(tmp_path, shipped=True) as server:  # deploy/redis.conf on a free port
        client = server.client()
        settings = {name: client.config_get(name)[name]
                    for name in ("maxmemory-policy", "save", "appendonly", "maxmemory")}
        assert settings["maxmemory-policy"] == "allkeys-lru"
        assert settings["save"] == "" and settings["appendonly"] == "no"
        assert int(settings["maxmemory"]) > 0



class ShippedRedis(RedisServer):
    """A Redis running ``deploy/<name>`` as shipped, on a free port (only its bind and port
    lines changed)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.name = name  # before super().__init__, which starts the server
        super().__init__(folder, shipped=True)

    def config(self) -> str:
        config = (REPO / "deploy" / self.name).read_text()
        config = re.sub(r"^bind .*$", "bind 127.0.0.1", config, flags=re.MULTILINE)
        config = re.sub(r"^port \d+$", f"port {self.port}", config, flags=re.MULTILINE)
        return config + f"\ndir {self.folder}\n"


def test_the_shipped_state_redis_never_evicts_and_keeps_nothing_on_disk(tmp_path):
    with ShippedRedis(tmp_path, "redis-state.conf") as server:
        client = server.client()
        settings = {name: client.config_get(name)[name]
                    for name in ("maxmemory-policy", "save", "appendonly", "maxmemory")}
        assert settings["maxmemory-policy"] == "noeviction"
        assert settings["save"] == "" and settings["appendonly"] == "no"
        assert int(settings["maxmemory"]) > 0


def noise_photo(seed: int, size: tuple[int, int] = (2000, 1500)) -> bytes:
    """A big JPEG no other is near (so each conversion is a miss, a new cache entry)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), np.uint8)
    return encode_image(Image.fromarray(pixels), "JPEG", quality=90)


def test_one_clients_churn_leaves_anothers_page_and_count_intact(models_dir, tmp_path):
    """8 addresses converting big photos within their limits, against the deploy/ layout:
    the cache in deploy/redis.conf's LRU Redis (its maxmemory made small here, so the
    churn evicts cache entries), counts and pages in deploy/redis-state.conf's noeviction
    one. A victim's result page still opens, and after its 429 it stays limited."""
    cache = ShippedRedis(tmp_path / "cache", "redis.conf")
    state = ShippedRedis(tmp_path / "state", "redis-state.conf")
    with cache, state:
        cache_client, state_client = cache.client(), state.client()
        used = int(cache_client.info("memory")["used_memory"])
        cache_client.config_set("maxmemory", used + (1 << 20))
        env = {**instance_env(models_dir, cache.uri), "ANIMEGAN_RATE_LIMIT": "5 per 10 minutes",
               "ANIMEGAN_STATE_STORAGE_URI": state.uri}
        with Server(env, log=tmp_path / "gunicorn.log") as server:
            victim = Client()
            posted = upload_with_form(victim, page_from=server, post_to=server)
            assert posted.status_code == 303, posted.text[:500]
            page = posted.headers["Location"]
            seeds = itertools.count()
            statuses = [victim.convert(server, noise_photo(next(seeds))).status_code
                        for _ in range(5)]
            assert statuses == [200] * 4 + [429], statuses

            for _ in range(8):
                churner = Client()
                for _ in range(5):
                    answer = churner.request("POST", server, "/animegan/convert?format=png",
                                             data=noise_photo(next(seeds)),
                                             headers={"Content-Type": "image/jpeg"})
                    assert answer.status_code == 200, answer.text[:300]
                    assert answer.headers["X-Cache"] == "MISS"

            evicted = int(cache_client.info("stats")["evicted_keys"])
            assert evicted > 0, "the churn should have evicted cache entries"
            assert int(state_client.info("stats")["evicted_keys"]) == 0
            opened = victim.request("GET", server, page)
            assert opened.status_code == 200, opened.text[:300]
            for image in set(re.findall(r'src="(/animegan/result/[^"?]+)"', opened.text)):
                assert victim.request("GET", server, image).status_code == 200
            assert victim.convert(server).status_code == 429  # still limited
            pages = [key for key in state_client.scan_iter("animegan:page:*")]
            counts = [key for key in state_client.scan_iter("LIMITS:*")]
            print(f"\n{evicted} cache keys evicted; state Redis: {len(counts)} counts of "
                  f"{max(state_client.memory_usage(k, samples=0) for k in counts)} B at most, "
                  f"{len(pages)} page of {state_client.memory_usage(pages[0], samples=0)} B")
            assert "has maxmemory-policy" not in server.output()
