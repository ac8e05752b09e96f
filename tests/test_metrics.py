"""Prometheus metrics: off by default, correct per app, summed over gunicorn workers."""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import photo_bytes
from prometheus_client.parser import text_string_to_metric_families
from servers import Server


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition as {(name, sorted labels): value}."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def convert(client, name: str = "coffee"):
    return client.post("/animegan/convert", data={
        "image": (io.BytesIO(photo_bytes(name)), "p.jpg"), "size": "96"})


def test_metrics_are_off_by_default(client):
    response = client.get("/animegan/metrics")
    assert response.status_code == 404 and "ANIMEGAN_METRICS" in response.json["error"]


def test_metrics_count_requests_conversions_cache_and_rate_limits(make_app):
    client = make_app(ANIMEGAN_METRICS=True, ANIMEGAN_RATE_LIMIT="3 per minute").test_client()
    assert client.get("/animegan/").status_code == 200
    # a miss, two hits (free), two misses more, and a sixth refused
    assert [convert(client, name).status_code for name in
            ("coffee", "coffee", "coffee", "astronaut", "rocket", "chelsea")] == [200] * 5 + [429]
    response = client.get("/animegan/metrics")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    samples = scrape(response.get_data(as_text=True))

    def requests_with(endpoint: str, status: str) -> float:
        return value(samples, "animegan_requests_total", endpoint=endpoint, status=status)

    assert requests_with("animegan.index", "200") == 1
    assert requests_with("animegan.convert", "200") == 5
    assert requests_with("animegan.convert", "429") == 1
    assert value(samples, "animegan_rate_limited_total") == 1
    # 96 px falls in the "128" size class; the style is the default
    assert value(samples, "animegan_conversion_seconds_count", style="other_style",
                 size="128") == 5
    assert value(samples, "animegan_conversion_seconds_sum", style="other_style",
                 size="128") > 0
    assert value(samples, "animegan_stage_seconds_count", stage="infer") == 3
    assert value(samples, "animegan_cache_lookups_total", result="miss") == 3
    assert value(samples, "animegan_cache_lookups_total", result="hit") == 2
    assert value(samples, "animegan_cache_bytes") > 1000
    assert value(samples, "animegan_model_load_seconds", style="other_style") > 0
    assert value(samples, "animegan_queue_depth") == value(samples, "animegan_in_flight") == 0


def test_two_apps_in_one_process_keep_their_own_counts(make_app):
    first = make_app(ANIMEGAN_METRICS=True).test_client()
    second = make_app(ANIMEGAN_METRICS=True).test_client()
    assert convert(first).status_code == 200
    count = "animegan_conversion_seconds_count"
    assert value(scrape(first.get("/animegan/metrics").get_data(as_text=True)), count,
                 style="other_style", size="128") == 1
    assert value(scrape(second.get("/animegan/metrics").get_data(as_text=True)), count,
                 style="other_style", size="128") == 0


@pytest.mark.server
def test_counts_are_summed_over_gunicorn_workers(models_dir, tmp_path):
    """Two workers, each with its own counters; every scrape sees the sum of both."""
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"stale file from an earlier run")
    server = Server({
        "ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_DEFAULT_STYLE": "test_style",
        "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_METRICS": "1",
        "ANIMEGAN_MAX_SIDE": "128", "ANIMEGAN_SAMPLE_SIZE": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "ANIMEGAN_TORCH_THREADS": "1",
        "ANIMEGAN_MAX_QUEUE": "0",  # the fewest threads the app accepts: 2 x 1 + 5
    }, log=tmp_path / "log.txt", args=("-w", "2", "--threads", "7", "--worker-connections", "2"))
    try:
        def healthz_count() -> float:
            samples = scrape(requests.get(f"{server.url}/animegan/metrics", timeout=30).text)
            return value(samples, "animegan_requests_total", endpoint="animegan.healthz",
                         status="200")

        before = healthz_count()  # the server's start-up polls
        # a new connection per request; go on until both workers have answered
        # in bursts of 16 at once, each worker taking 2 connections at a time: the kernel
        # wakes the same idle worker first, so one at a time would all go to it
        sent, pids = 0, set()

        def pid(_: int) -> int:
            return requests.get(f"{server.url}/animegan/healthz", timeout=30).json()["pid"]

        with ThreadPoolExecutor(16) as pool:
            while len(pids) < 2 and sent < 320:
                pids.update(pool.map(pid, range(16)))
                sent += 16
        assert len(pids) == 2, "one worker answered every request"
        for name in ("coffee", "astronaut", "chelsea"):
            response = requests.post(f"{server.url}/animegan/convert", timeout=60,
                                     files={"image": ("p.jpg", photo_bytes(name))})
            assert response.status_code == 200
        assert not (metrics_dir / "counter_999999.db").exists(), \
            "gunicorn.conf.py must clear files left by an earlier run"
        for _ in range(3):  # whichever worker answers the scrape reports the same sums
            assert healthz_count() == before + sent
            samples = scrape(requests.get(f"{server.url}/animegan/metrics", timeout=30).text)
            assert value(samples, "animegan_conversion_seconds_count", style="test_style",
                         size="128") == 3
            assert value(samples, "animegan_model_load_seconds", style="test_style") > 0
    finally:
        server.stop()


def test_queue_depth_and_in_flight_follow_the_engine(make_app):
    app = make_app(ANIMEGAN_METRICS=True, ANIMEGAN_MAX_QUEUE=2)
    engine = app.extensions["animegan"].engine
    client = app.test_client()
    release = threading.Event()

    def gauges() -> tuple[float, float]:
        samples = scrape(client.get("/animegan/metrics").get_data(as_text=True))
        return value(samples, "animegan_in_flight"), value(samples, "animegan_queue_depth")

    def hold() -> None:
        with engine.gate.slot():
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    waiter = threading.Thread(target=lambda: convert(app.test_client()))
    try:
        deadline = time.monotonic() + 30
        while gauges() != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gauges() == (1, 0)  # one running, none waiting
        waiter.start()
        while gauges() != (1, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gauges() == (1, 1)  # the conversion waits for the model
    finally:
        release.set()
        holder.join()
        if waiter.is_alive() or waiter.ident:
            waiter.join()
    assert gauges() == (0, 0)
