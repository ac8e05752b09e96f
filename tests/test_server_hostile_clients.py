"""The real gunicorn against hostile clients and uploads: slow clients, chunked bodies over
the limit, decoder bombs; and what the shipped config adds: logs, one control socket each."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from conftest import encode_image, photo_bytes
from flask_animegan.config import UPLOAD_GRACE_SECONDS
from gunicorn.ctl.client import ControlClient
from PIL import Image
from servers import Server, Trickle, child_pids, proc_status_kib
from upload_variants import gif_huge_screen, jpeg_scan_bomb, png_strip

pytestmark = pytest.mark.server
LIMIT = 1 << 20  # ANIMEGAN_MAX_UPLOAD_BYTES of the shared server


def start(models_dir: Path, log: Path, **env: str) -> Server:
    return Server({"ANIMEGAN_MODELS_DIR": str(models_dir), "ANIMEGAN_DEFAULT_STYLE": "test_style",
                   "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "",
                   "ANIMEGAN_CACHE_TTL": "0", "ANIMEGAN_MAX_SIDE": "256", **env}, log=log)


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    """The shipped config (11 threads, log level info) with a 1 MiB upload limit."""
    instance = start(models_dir, tmp_path_factory.mktemp("hardening") / "gunicorn.log",
                     ANIMEGAN_MAX_UPLOAD_BYTES=str(LIMIT))
    yield instance
    instance.stop()


def convert(server: Server, body, timeout: float = 60, **headers: str) -> requests.Response:
    """POST ``body`` to /convert; a generator body goes chunked, with no Content-Length."""
    return requests.post(f"{server.url}/animegan/convert?size=128", data=body,
                         headers={"Content-Type": "image/jpeg", **headers}, timeout=timeout)


# --- slow clients -------------------------------------------------------------------------

def timed(call) -> tuple[requests.Response, float]:
    began = time.monotonic()
    response = call()
    return response, time.monotonic() - began


def test_slow_clients_up_to_threads_minus_one_do_not_block_other_requests(server):
    """Three threads held by clients trickling a byte a second (one its headers, two their
    bodies, within their grace period): health, the host's pages and a conversion answer."""
    body_head = (b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                 b"Content-Length: 1000000\r\n\r\n")
    trickles = [Trickle(server.port, b"GET /about HTTP/1.1\r\nHost: x\r\nX-Slow: ", b"a"),
                Trickle(server.port, body_head, b"\xff"),
                Trickle(server.port, body_head, b"\xff")]
    for trickle in trickles:
        trickle.start()
    try:
        deadline = time.monotonic() + 10
        while min(t.sent for t in trickles) < 2:  # each has had a thread for over a second
            assert time.monotonic() < deadline and all(t.is_alive() for t in trickles)
            time.sleep(0.1)
        timings = {}
        for name, call in [
            ("healthz", lambda: requests.get(f"{server.url}/animegan/healthz", timeout=10)),
            ("host page", lambda: requests.get(f"{server.url}/", timeout=10)),
            ("upload page", lambda: requests.get(f"{server.url}/animegan/", timeout=10)),
            ("conversion", lambda: convert(server, photo_bytes("coffee"), timeout=30)),
            ("healthz again", lambda: requests.get(f"{server.url}/animegan/healthz", timeout=10)),
        ]:
            response, timings[name] = timed(call)
            assert response.status_code == 200, (name, response.status_code)
        print("\nwith 3 trickles open: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
        assert max(v for k, v in timings.items() if k != "conversion") < 2, timings
        assert timings["conversion"] < 15, timings
        assert not any(t.closed_by_server for t in trickles)  # they held their threads throughout
    finally:
        for trickle in trickles:
            trickle.stopping.set()
        for trickle in trickles:
            trickle.join()


def test_trickling_uploads_are_cut_and_never_block_other_clients_conversions(server):
    """Three uploads trickling a byte every 2 s, straight at gunicorn: they take no place
    in the admission, each is cut with 408 after the grace period (UPLOAD_GRACE_SECONDS),
    and other clients' conversions answer 200 throughout."""
    idle = [timed(lambda: convert(server, photo_bytes("coffee"), timeout=30)) for _ in range(3)]
    assert all(response.status_code == 200 for response, _ in idle)
    body_head = (b"POST /animegan/convert HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                 b"Content-Length: 1000000\r\n\r\n")
    trickles = [Trickle(server.port, body_head, b"\xff", interval=2.0) for _ in range(3)]
    began = time.monotonic()
    for trickle in trickles:
        trickle.start()
    busy = []
    try:
        while not all(t.closed_by_server for t in trickles):
            assert time.monotonic() - began < UPLOAD_GRACE_SECONDS + 30, "never cut"
            response, seconds = timed(lambda: convert(server, photo_bytes("coffee"),
                                                      timeout=30))
            assert response.status_code == 200, (response.status_code, response.text)
            busy.append(seconds)
        cut_after = time.monotonic() - began
    finally:
        for trickle in trickles:
            trickle.stopping.set()
        for trickle in trickles:
            trickle.join()
    assert [t.answer.split(b" ")[1:2] for t in trickles] == [[b"408"]] * 3, \
        [t.answer for t in trickles]
    assert cut_after > UPLOAD_GRACE_SECONDS - 1
    health = requests.get(f"{server.url}/animegan/healthz", timeout=10).json()
    assert health["admission"]["admitted"] == 0
    idle_s = sorted(seconds for _, seconds in idle)
    print(f"\nidle conversions {', '.join(f'{s:.2f}' for s in idle_s)} s; with 3 trickles "
          f"{len(busy)} conversions, all 200, median {sorted(busy)[len(busy) // 2]:.2f} s, "
          f"worst {max(busy):.2f} s; trickles cut with 408 after {cut_after:.1f} s")


# --- chunked bodies over ANIMEGAN_MAX_UPLOAD_BYTES ------------------------------------------

def chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


def noise_jpeg() -> bytes:
    """A valid 1200x1200 JPEG of noise: about 1.6 MB, over the 1 MiB limit."""
    pixels = np.random.default_rng(0).integers(0, 256, (1200, 1200, 3), dtype=np.uint8)
    return encode_image(Image.fromarray(pixels), "JPEG", quality=95)


def motion_photo() -> bytes:
    """A small photo with 2 MiB after its end (as phones append a video): the first 1 MiB
    is a complete JPEG, so a body cut at the limit still decodes."""
    return photo_bytes("coffee") + b"\0\0\0\x18ftypmp42" + bytes(2 << 20)


def multipart(data: bytes, boundary: str = "hardening-boundary") -> tuple[bytes, str]:
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            f'filename="photo.jpg"\r\nContent-Type: image/jpeg\r\n\r\n').encode()
    body = head + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("kind", ["jpeg", "png", "motion photo", "multipart"])
@pytest.mark.parametrize("sent", ["chunked", "with Content-Length"])
def test_an_upload_over_the_limit_gets_413_however_it_is_sent(server, kind, sent):
    if kind == "png":
        data, content_type = photo_bytes("retina", "PNG"), "image/png"  # about 1.4 MB
    elif kind == "motion photo":
        data, content_type = motion_photo(), "image/jpeg"
    else:
        data, content_type = noise_jpeg(), "image/jpeg"
    if kind == "multipart":
        data, content_type = multipart(data)
    assert len(data) > LIMIT
    response = convert(server, chunks(data) if sent == "chunked" else data,
                       **{"Content-Type": content_type})
    assert response.status_code == 413, response.headers["Content-Type"]
    assert response.json()["status"] == 413


def test_a_chunked_upload_of_exactly_the_limit_is_converted(server):
    """The limit is the largest accepted body: a check for 'more' must not refuse it."""
    photo = photo_bytes("coffee")
    raw = photo + bytes(LIMIT - len(photo))
    assert convert(server, chunks(raw)).status_code == 200
    overhead = len(multipart(b"")[0])
    body, content_type = multipart(photo + bytes(LIMIT - overhead - len(photo)))
    assert len(raw) == len(body) == LIMIT
    assert convert(server, chunks(body), **{"Content-Type": content_type}).status_code == 200


# --- logs ---------------------------------------------------------------------------------

def test_the_startup_line_and_one_json_line_per_conversion_reach_gunicorns_log(server):
    assert convert(server, photo_bytes("rocket")).status_code == 200
    server.wait_for_output(r"\[INFO\] flask_animegan: style '?test_style'? loaded")
    line = server.wait_for_output(r"\[INFO\] animegan\.conversion (\{.*\})$")
    record = json.loads(line.group(1))
    assert record["status"] == 200 and record["style"] == "test_style"


def test_animegan_log_level_applies_to_the_package_lines(models_dir, tmp_path):
    quiet = start(models_dir, tmp_path / "gunicorn.log", GUNICORN_CMD_ARGS="--log-level warning")
    try:
        assert convert(quiet, photo_bytes("rocket")).status_code == 200
        time.sleep(0.5)
        assert "flask_animegan: style" not in quiet.output()
        assert "animegan.conversion" not in quiet.output()
    finally:
        quiet.stop()


# --- control sockets ------------------------------------------------------------------------

def listening_port(path: Path) -> int:
    """The port of the gunicorn whose control socket is at ``path``."""
    with ControlClient(str(path), timeout=10) as client:
        listeners = client.send_command("show listeners")["listeners"]
    return int(listeners[0]["address"].rsplit(":", 1)[1])


#: The control-socket tests start five instances: torch fp32 spares each the backend timings
#: (and, with a HOME of its own, the INT8 quantising) that `auto` runs at its warm-up.
PLAIN_BACKEND = {"ANIMEGAN_BACKEND": "torch", "ANIMEGAN_PRECISION": "fp32"}


def test_by_default_no_instance_opens_a_control_socket(models_dir, tmp_path):
    """gunicorn 27's default is one socket per user, which a second instance takes over."""
    home, runtime = tmp_path / "home", tmp_path / "run"
    home.mkdir(), runtime.mkdir()
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime), **PLAIN_BACKEND}
    first = start(models_dir, tmp_path / "first.log", **env)
    second = start(models_dir, tmp_path / "second.log", **env)
    try:
        for instance in (first, second):
            assert requests.get(f"{instance.url}/animegan/healthz", timeout=10).ok
        second.stop()
        assert requests.get(f"{first.url}/animegan/healthz", timeout=10).ok
        assert not (home / ".gunicorn").exists() and not (runtime / "gunicorn.ctl").exists()
        assert "Control socket listening" not in first.output() + second.output()
    finally:
        first.stop()
        second.stop()


def test_instances_with_their_own_control_sockets_leave_each_other_alone(models_dir, tmp_path):
    first_path, second_path = tmp_path / "first.ctl", tmp_path / "second.ctl"
    first = start(models_dir, tmp_path / "first.log", ANIMEGAN_CONTROL_SOCKET=str(first_path),
                  **PLAIN_BACKEND)
    second = start(models_dir, tmp_path / "second.log", ANIMEGAN_CONTROL_SOCKET=str(second_path),
                   **PLAIN_BACKEND)
    # a third one given the first's path must not take it over
    third = start(models_dir, tmp_path / "third.log", ANIMEGAN_CONTROL_SOCKET=str(first_path),
                  **PLAIN_BACKEND)
    try:
        first.wait_for_output("Control socket listening")
        second.wait_for_output("Control socket listening")
        third.wait_for_output("belongs to a running gunicorn")
        assert listening_port(first_path) == first.port
        assert listening_port(second_path) == second.port
        second.stop()
        third.stop()
        assert not second_path.exists()
        assert listening_port(first_path) == first.port  # still there, still the first's
        assert requests.get(f"{first.url}/animegan/healthz", timeout=10).status_code == 200
    finally:
        for instance in (first, second, third):
            instance.stop()
    assert not first_path.exists()


# --- acceptance: decoder bombs against the default config -------------------------------------

@pytest.fixture(scope="module")
def bombs(tmp_path_factory) -> dict[str, bytes]:
    """Each bomb once per session (the 8000x5000 JPEG takes seconds to encode)."""
    folder = tmp_path_factory.getbasetemp() / "bombs"
    folder.mkdir(exist_ok=True)
    makers = {"jpeg scan bomb 8000x5000": lambda: jpeg_scan_bomb(8000, 5000, 1000),
              "png 1x40000000": lambda: png_strip(1, 40_000_000),
              "gif 6000x6000 screen": gif_huge_screen}
    out = {}
    for name, make in makers.items():
        path = folder / name.replace(" ", "_")
        if not path.exists():
            path.write_bytes(make())
        out[name] = path.read_bytes()
    return out


def monitor_mib(kib: int) -> int:
    return round(kib / 1024)


class MemoryWatch(threading.Thread):
    """Samples the peak resident memory (VmHWM) of the worker's child processes, which
    die with their peaks unread otherwise, 20 times a second. A child caught between
    (v)fork and exec is skipped: it still shares the worker's memory and shows the
    worker's peak (CI once read 979 MiB so), not a helper's."""

    def __init__(self, worker: int) -> None:
        super().__init__(daemon=True)
        self.worker = worker
        self.worker_cmdline = Path(f"/proc/{worker}/cmdline").read_bytes()
        self.stopping = threading.Event()
        self.children_peak_kib = 0  # the most their peaks summed to at one sample
        self.children_most = 0  # the most helpers alive at one sample
        self.child_peak_kib = 0  # the largest peak of any one helper

    def run(self) -> None:
        while not self.stopping.wait(0.05):
            total, alive = 0, 0
            for pid in child_pids(self.worker):
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes() == self.worker_cmdline:
                        continue  # not yet a helper (before exec): the worker's pages
                    peak = proc_status_kib(pid, "VmHWM")
                except (FileNotFoundError, StopIteration):
                    continue  # gone already, or a zombie
                total, alive = total + peak, alive + 1
                self.child_peak_kib = max(self.child_peak_kib, peak)
            self.children_peak_kib = max(self.children_peak_kib, total)
            self.children_most = max(self.children_most, alive)


class HealthWatch(threading.Thread):
    """Polls /animegan/healthz back to back, keeping the slowest answer (or failure)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopping = threading.Event()
        self.slowest = 0.0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                status = requests.get(f"{self.url}/animegan/healthz", timeout=10).status_code
                if status != 200:
                    self.failures.append(f"HTTP {status}")
            except requests.RequestException as exc:
                self.failures.append(repr(exc))
            self.slowest = max(self.slowest, time.monotonic() - began)
            self.stopping.wait(0.1)


def test_decoder_bombs_are_answered_quickly_in_bounded_memory(tmp_path, bombs):
    """Four of each bomb at once against the default config and the shipped style: every
    request answered (4xx, or 503 for the one past the three the app admits; never another
    5xx) within 5 s, health within 1 s throughout, and the worker's
    peak memory (its helper processes' included) up by less than 600 MiB."""
    server = Server({"ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": ""},
                    log=tmp_path / "gunicorn.log")
    try:
        worker = server.worker_pid()
        base_kib = server.worker_peak_kib()
        memory = MemoryWatch(worker)
        memory.start()
        base_children_kib = sum(proc_status_kib(pid, "VmHWM") for pid in child_pids(worker))
        report, failed = [], []
        for name, body in bombs.items():
            health = HealthWatch(server.url)
            health.start()

            def one(_: int, body=body) -> tuple[int, float]:
                began = time.monotonic()
                response = requests.post(f"{server.url}/animegan/convert", data=body,
                                         headers={"Content-Type": "application/octet-stream"},
                                         timeout=60)
                return response.status_code, time.monotonic() - began

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                results = list(pool.map(one, range(4)))
            health.stopping.set()
            health.join()
            report.append(f"{name} ({len(body)} bytes): "
                          + ", ".join(f"{status} in {seconds:.2f} s" for status, seconds in results)
                          + f"; healthz at worst {health.slowest:.2f} s {health.failures or ''}")
            # 503: a fourth at once finds the app's three conversions in use (admission)
            if (any((status >= 500 and status != 503) or seconds >= 5
                    for status, seconds in results)
                    or health.failures or health.slowest >= 1):
                failed.append(name)
        memory.stopping.set()
        memory.join()
        worker_growth = server.worker_peak_kib() - base_kib
        children_growth = max(0, memory.children_peak_kib - base_children_kib)
        report.append(f"worker peak +{worker_growth / 1024:.0f} MiB, helper processes' peak "
                      f"{memory.children_peak_kib / 1024:.0f} MiB "
                      f"(+{children_growth / 1024:.0f} MiB)")
        print("\n" + "\n".join(report))
        # Each helper (the photo decoders, and the frames helpers that probe what might be
        # an animation) lives under an address-space limit of ANIMEGAN_MAX_DECODE_BYTES
        # (256 MiB) + 64 MiB slack + its answer: no one helper may pass that, and the
        # worker itself must not grow (the bombs never reach it).
        report.append(f"largest helper peak {monitor_mib(memory.child_peak_kib)} MiB, "
                      f"{memory.children_most} helpers at most")
        assert not failed and worker_growth < 100 * 1024, "\n".join(report)
        assert memory.child_peak_kib < (256 + 96) * 1024, "\n".join(report)
    finally:
        server.stop()
