"""A real gunicorn serving the example app, for tests that need the real server."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from conftest import REPO, free_port

GUNICORN = Path(sys.executable).with_name("gunicorn")


class Server:
    def __init__(self, env: dict[str, str], log: Path, cpus: set[int] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [str(GUNICORN), "-c", "gunicorn.conf.py", "-b", f"127.0.0.1:{self.port}",
             *args, "example_app:app"],
            cwd=REPO, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if requests.get(f"{self.url}/animegan/healthz", timeout=10).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.3)
        raise AssertionError(f"gunicorn did not become healthy:\n{self.output()[-3000:]}")

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pid(self) -> int:
        """The (single) worker process forked by the gunicorn master."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
        return int(children.split()[0])

    def worker_rss_kib(self) -> int:
        return proc_status_kib(self.worker_pid(), "VmRSS")

    def worker_peak_kib(self) -> int:
        """The worker's peak resident memory since it started (VmHWM)."""
        return proc_status_kib(self.worker_pid(), "VmHWM")

    def wait_for_output(self, pattern: str, timeout: float = 10) -> re.Match:
        """The first match of the regular expression ``pattern`` in the log, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.output(), re.MULTILINE)
            if match or time.monotonic() > deadline:
                assert match, f"{pattern!r} not in the log:\n{self.output()[-3000:]}"
                return match
            time.sleep(0.1)

    def stop(self) -> None:
        if self.log.closed:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def proc_status_kib(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (VmRSS, VmHWM, ...) in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith(f"{field}:")))


def child_pids(pid: int) -> list[int]:
    """The live children of process ``pid`` (of any of its threads), grandchildren included."""
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return found + [grandchild for child in found for grandchild in child_pids(child)]


class Trickle(threading.Thread):
    """A slow client: it connects from ``address``, sends ``head``, then ``drip`` every
    ``interval`` seconds until stopped, never finishing its request; ``sent`` counts the
    drips, and ``closed_by_server`` notes whether the server ever closed the connection."""

    def __init__(self, port: int, head: bytes, drip: bytes, *, interval: float = 1.0,
                 address: str = "127.0.0.1") -> None:
        super().__init__(daemon=True)
        self.port, self.head, self.drip = port, head, drip
        self.interval, self.address = interval, address
        self.stopping = threading.Event()
        self.sent = 0
        self.closed_by_server = False

    def run(self) -> None:
        with socket.socket() as sock:
            sock.bind((self.address, 0))
            sock.settimeout(10)
            sock.connect(("127.0.0.1", self.port))
            sock.settimeout(None)  # so that MSG_DONTWAIT below returns at once
            sock.sendall(self.head)
            while not self.stopping.wait(self.interval):
                try:
                    if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        self.closed_by_server = True
                        return
                except BlockingIOError:
                    pass  # still open, nothing said
                sock.sendall(self.drip)
                self.sent += 1
