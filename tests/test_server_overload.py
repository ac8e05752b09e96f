"""Overload, slow clients, shutdown and a soak, against the real gunicorn."""

from __future__ import annotations

import collections
import concurrent.futures
import io
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
import requests
from conftest import REPO, free_port, photo_bytes
from PIL import Image
from servers import Server

from flask_animegan.config import SPARE_READERS

pytestmark = pytest.mark.server
SOAK_REQUESTS = int(os.environ.get("ANIMEGAN_SOAK_REQUESTS", "500"))
FLOOD_SECONDS = 10


def start(models_dir, tmp_path, **env: str) -> Server:
    return Server({"ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_DEFAULT_STYLE": "test_style",
                   "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "",
                   "ANIMEGAN_CACHE_TTL": "0", **env}, log=tmp_path / "gunicorn.log")


def convert(server: Server, data: bytes, size: int = 128, timeout: float = 120):
    return requests.post(f"{server.url}/animegan/convert?size={size}", data=data,
                         headers={"Content-Type": "image/jpeg"}, timeout=timeout)


def test_overload_answers_every_request_and_recovers(models_dir, tmp_path):
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_QUEUE="2", ANIMEGAN_MAX_SIDE="512")
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
    server = start(models_dir, tmp_path)
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


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP response with a Content-Length from ``sock``: its head and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside the body"
        body += chunk
    return head, body


def test_a_refused_upload_gets_its_503_and_keeps_its_connection(models_dir, tmp_path):
    """With every upload the app lets arrive at once held by a trickling client (1 +
    SPARE_READERS; each is cut after UPLOAD_GRACE_SECONDS, after this test), a 13 MB upload
    is refused: its body is read and dropped first (gunicorn would drop 64 KiB of it and
    reset the connection), so the client reads the whole 503 and sends its next request
    on the same connection; one that stops sending its body gets the 503 after
    views.DROP_BODY_SECONDS, and the connection ends a few seconds later (gunicorn's own
    bound on an unread body), never held open."""
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_QUEUE="0")
    stop = threading.Event()
    sent = []

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: image/jpeg\r\nContent-Length: 100000\r\n\r\n")
            while not stop.is_set():
                sock.sendall(b"\xff")
                sent.append(1)
                time.sleep(0.2)

    holders = [threading.Thread(target=trickle) for _ in range(1 + SPARE_READERS)]
    for holder in holders:
        holder.start()
    data = big_upload()
    head = (b"POST /animegan/convert?size=128 HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(data))
    try:
        deadline = time.monotonic() + 30
        while requests.get(f"{server.url}/animegan/healthz",
                           timeout=10).json()["admission"]["reading"] < len(holders):
            assert time.monotonic() < deadline, "the trickling uploads never arrived"
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            for _ in range(3):  # three refusals, one connection
                sock.sendall(head + data)
                status, body = _read_response(sock)
                assert status.startswith(b"HTTP/1.1 503"), status
                assert b"retry-after:" in status.lower()
                assert b"connection: close" not in status.lower()
                assert b"busy" in body
            sock.sendall(b"GET /animegan/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body = _read_response(sock)
            assert status.startswith(b"HTTP/1.1 200"), status

        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(head + data[:1000])  # then nothing: slower than the drop allows
            began = time.monotonic()
            status, _ = _read_response(sock)
            assert status.startswith(b"HTTP/1.1 503"), status
            assert sock.recv(1) == b""  # the server ended the connection
            assert time.monotonic() - began < 15
        assert all(h.is_alive() for h in holders) and len(sent) > 3  # held all along
    finally:
        stop.set()
        for holder in holders:
            holder.join()
        server.stop()


def test_every_answer_before_the_body_keeps_its_connection(models_dir, tmp_path):
    """A 429 of the rate limit and a 400 for a parameter are answered before the upload is
    read too; each of them, on one keep-alive connection, reaches the client whole after
    a 13 MB upload, and the connection serves the next request."""
    server = start(models_dir, tmp_path, ANIMEGAN_RATE_LIMIT="2 per hour")
    data = big_upload()

    def post(query: bytes) -> bytes:
        return (b"POST /animegan/convert?" + query + b" HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(data) + data)

    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(post(b"size=banana"))
            status, body = _read_response(sock)
            assert status.startswith(b"HTTP/1.1 400") and b"size" in body, status
            for size in (b"128", b"120"):  # the limit's two (two sizes: two misses)
                sock.sendall(post(b"size=" + size))
                status, _ = _read_response(sock)
                assert status.split(b" ")[1] in (b"200", b"400", b"429"), status
            for _ in range(2):
                sock.sendall(post(b"size=128"))
                status, body = _read_response(sock)
                assert status.startswith(b"HTTP/1.1 429"), status
            sock.sendall(b"GET /animegan/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _ = _read_response(sock)
            assert status.startswith(b"HTTP/1.1 200"), status
    finally:
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


# -- floods: every conversion the app admits holds a thread, and one stays free ------------
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
          (0, 1, 1, 2))


def slow_decode_png(side: int = 6300) -> bytes:
    """A 39 KB palette PNG of side x side pixels (40 M: within ANIMEGAN_MAX_PIXELS), Adam7
    interlaced: its all-zero rows deflate 1000:1, and decoding it inflates, de-interlaces
    and converts 40 M pixels (about 0.4 s of a core alone, 1-2 s each in a flood)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    deflate = zlib.compressobj(9)
    rows = []
    for x0, y0, dx, dy in _ADAM7:
        width, height = (side - x0 + dx - 1) // dx, (side - y0 + dy - 1) // dy
        rows.append(deflate.compress((b"\0" + bytes(width)) * height))  # filter 0, index 0
    rows.append(deflate.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 3, 0, 0, 1)  # 8-bit palette, Adam7
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"PLTE", bytes(3) + b"\xff" * 3)
            + chunk(b"IDAT", b"".join(rows)) + chunk(b"IEND", b""))


def big_upload(side: int = 2560) -> bytes:
    """A 13 MB JPEG (noise at quality 100), under the 16 MiB ANIMEGAN_MAX_UPLOAD_BYTES."""
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=100)
    return buffer.getvalue()


FLOODS = {  # name: (upload, Content-Type, clients)
    "slow-decode PNGs": (slow_decode_png, "image/png", 8),
    "13 MB uploads": (big_upload, "image/jpeg", 12),
}


@pytest.mark.parametrize("kind", FLOODS)
def test_a_flood_of_conversions_leaves_healthz_answering(models_dir, tmp_path, kind):
    """Clients send conversions as fast as they are answered, for FLOOD_SECONDS; /healthz,
    probed every 0.2 s on a new connection (as a load balancer does), answers each probe
    within a second, and every conversion gets 200 or a 503 with Retry-After, never a reset.
    gunicorn runs with its default threads (ANIMEGAN_MAX_QUEUE + 2: gunicorn.conf.py)."""
    make, content_type, clients = FLOODS[kind]
    data = make()
    server = start(models_dir, tmp_path, ANIMEGAN_MAX_QUEUE="2", ANIMEGAN_SAMPLE_SIZE="0")
    url = f"{server.url}/animegan/convert?size=128"
    stop = threading.Event()
    statuses: list[int] = []
    missing_retry_after: list[int] = []
    failures: list[str] = []
    probes: list[float] = []

    def client() -> None:
        with requests.Session() as session:  # keep-alive, as browsers and SDKs do
            while not stop.is_set():
                try:
                    response = session.post(url, data=data, timeout=120,
                                            headers={"Content-Type": content_type})
                except requests.RequestException as exc:
                    failures.append(repr(exc))
                    continue
                statuses.append(response.status_code)
                if response.status_code == 503 and not response.headers.get("Retry-After"):
                    missing_retry_after.append(503)

    def probe() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                requests.get(f"{server.url}/animegan/healthz", timeout=60).raise_for_status()
            except requests.RequestException as exc:
                failures.append(f"/healthz: {exc!r}")
            probes.append(time.monotonic() - began)
            stop.wait(0.2)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    prober = threading.Thread(target=probe)
    try:
        for thread in threads:
            thread.start()
        time.sleep(1)  # the flood is on before the first probe
        prober.start()
        time.sleep(FLOOD_SECONDS)
        stop.set()
        for thread in (*threads, prober):
            thread.join(180)
        health = requests.get(f"{server.url}/animegan/healthz", timeout=10).json()
    finally:
        stop.set()
        server.stop()
    print(f"\n{kind}: {len(probes)} probes of /healthz, slowest {max(probes):.2f} s; "
          f"conversions {collections.Counter(statuses)}")
    assert failures == []
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 1, collections.Counter(statuses)
    assert missing_retry_after == []
    assert len(probes) >= FLOOD_SECONDS  # probed all along
    assert max(probes) <= 1.0, sorted(probes)[-5:]
    assert health["admission"] == {"admitted": 0, "capacity": 3, "reading": 0,
                                   "refused": health["admission"]["refused"]}


def test_too_few_threads_stop_the_server_naming_the_fix(models_dir, tmp_path):
    """--threads 3 with ANIMEGAN_MAX_QUEUE=2: three conversions would take every thread;
    the worker refuses to serve, and gunicorn exits naming the settings and the fix."""
    env = {**os.environ, "ANIMEGAN_MODELS_DIR": str(models_dir),
           "ANIMEGAN_DEFAULT_STYLE": "test_style", "ANIMEGAN_MAX_QUEUE": "2",
           "ANIMEGAN_ACCESS_LOG": ""}
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py",
                           "-b", f"127.0.0.1:{free_port()}", "--threads", "3",
                           "example_app:app"], check=False, cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "3 threads (ANIMEGAN_SERVER_THREADS or --threads)" in done.stderr, done.stderr[-3000:]
    assert "lets 10 requests hold a thread at once (1 + ANIMEGAN_MAX_QUEUE" in done.stderr
    assert "Set ANIMEGAN_SERVER_THREADS to 11 or more" in done.stderr
