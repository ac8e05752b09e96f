"""Overload, slow clients, shutdown and a soak, against the real gunicorn."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import threading
import time

import pytest
import requests
from conftest import photo_bytes
from servers import Server

pytestmark = pytest.mark.server
SOAK_REQUESTS = int(os.environ.get("ANIMEGAN_SOAK_REQUESTS", "500"))


def start(models_dir, tmp_path, **env: str) -> Server:
    return Server({"ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_DEFAULT_STYLE": "test_style",
                   "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "",
                   "ANIMEGAN_CACHE_TTL": "0", **env}, log=tmp_path / "gunicorn.log")


def convert(server: Server, data: bytes, size: int = 128, timeout: float = 120):
    return requests.post(f"{server.url}/animegan/convert?size={size}", data=data,
                         headers={"Content-Type": "image/jpeg"}, timeout=timeout)


def test_overload_answers_every_request_and_recovers(models_dir, tmp_path):
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_QUEUE="2", ANIMEGAN_THREADS="4",
                   ANIMEGAN_MAX_SIDE="512")
    try:
        pid = server.worker_pid()
        data = photo_bytes("astronaut")

        def one(_: int) -> tuple[int, float, str | None]:
            began = time.monotonic()
            response = convert(server, data, size=512)
            return response.status_code, time.monotonic() - began, response.headers.get(
                "Retry-After")

        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            results = list(pool.map(one, range(20)))
        statuses = [status for status, _, _ in results]
        assert set(statuses) <= {200, 429, 503}, statuses
        assert statuses.count(200) >= 1 and statuses.count(503) >= 1, statuses
        for status, seconds, retry_after in results:
            assert seconds < 90  # bounded: nobody hangs
            if status == 503:
                assert retry_after is not None and int(retry_after) >= 1
        assert server.worker_pid() == pid  # the worker survived
        assert convert(server, data).status_code == 200  # and serves at once afterwards
        assert requests.get(f"{server.url}/animegan/healthz", timeout=10).json()["queued"] == 0
    finally:
        server.stop()


def test_a_slow_upload_does_not_block_other_clients(models_dir, tmp_path):
    """A client trickling its body holds one gunicorn thread; the other threads keep serving.

    gunicorn's gthread worker reads the body in the request thread, so each slow client
    costs one thread until it finishes or the timeout hits: put nginx in front (deploy/).
    """
    server = start(models_dir, tmp_path, ANIMEGAN_THREADS="4")
    stop = threading.Event()
    sent = []

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                sock.sendall(b"\xff")
                sent.append(1)
                time.sleep(0.2)

    slow = threading.Thread(target=trickle)
    slow.start()
    try:
        while len(sent) < 3:
            time.sleep(0.05)
        data = photo_bytes("coffee")
        for _ in range(3):
            assert convert(server, data, timeout=30).status_code == 200
        assert slow.is_alive()  # the slow client was still sending all along
    finally:
        stop.set()
        slow.join()
        server.stop()


def test_sigterm_lets_the_in_flight_conversion_finish(models_dir, tmp_path):
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_SIDE="1024", ANIMEGAN_PRECISION="fp32")
    outcome: dict = {}

    def slow_conversion() -> None:
        big = photo_bytes("retina")  # 1411 x 1411: a 1024-px fp32 conversion takes seconds
        try:
            outcome["response"] = convert(server, big, size=1024)
        except requests.RequestException as exc:
            outcome["error"] = exc

    worker = server.worker_pid()
    request = threading.Thread(target=slow_conversion)
    request.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            health = requests.get(f"{server.url}/animegan/healthz", timeout=10).json()
            if health["in_flight"]:
                break
            time.sleep(0.05)
        os.kill(server.process.pid, signal.SIGTERM)
        request.join(120)
        assert "response" in outcome, outcome
        assert outcome["response"].status_code == 200
        assert outcome["response"].headers["Content-Type"] == "image/jpeg"
        server.process.wait(60)
        assert not os.path.exists(f"/proc/{worker}/status")
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.url}/animegan/healthz", timeout=5)
    finally:
        server.stop()


def test_soak_sequential_conversions_without_errors_or_memory_growth(models_dir, tmp_path):
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_SIDE="160")
    try:
        photos = [photo_bytes(name) for name in ("astronaut", "coffee", "rocket", "chelsea")]
        sizes = (32, 64, 96, 128, 160)
        warm_up = 100  # every thread (and its malloc arena) has served all shapes by then
        baseline = None
        errors = []
        for i in range(SOAK_REQUESTS):
            response = convert(server, photos[i % len(photos)], size=sizes[i % len(sizes)],
                               timeout=60)
            if response.status_code != 200:
                errors.append((i, response.status_code))
            if i + 1 == warm_up:
                baseline = server.worker_rss_kib()
        growth = server.worker_rss_kib() / baseline - 1
        print(f"\nsoak: {SOAK_REQUESTS} conversions, {len(errors)} errors, "
              f"worker RSS {baseline / 1024:.0f} MiB -> {baseline * (1 + growth) / 1024:.0f} MiB "
              f"({growth:+.1%}) after warm-up")
        assert errors == []
        assert growth < 0.05
    finally:
        server.stop()
