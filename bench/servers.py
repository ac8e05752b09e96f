"""Real gunicorn servers for the service sections: start, wait for readiness, inspect, stop.

Each server is a subprocess of the venv's gunicorn on a free loopback port, run
from the repository root with ``os.environ`` plus the given overrides, logging to a
file; the worker's CPU time and memory are read from ``/proc``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

from .inputs import REPO

GUNICORN = Path(sys.executable).with_name("gunicorn")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the bench dies, so no server outlives it."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GunicornServer:
    """One gunicorn master with one worker; use as a context manager."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path, *,
                 ready_path: str, ready_timeout: float = 180.0) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_dir / f"gunicorn-{name}.log"
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> GunicornServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Launch gunicorn and wait until ``ready_path`` answers 200; raise with the log tail if not."""
        command = [str(GUNICORN), *self.args, "-b", f"127.0.0.1:{self.port}"]
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env={**os.environ, **self.env},
                                            stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=_die_with_parent)
        while time.monotonic() - started < self.ready_timeout:
            if self.process.poll() is not None:
                break
            try:
                if requests.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    self.startup_s = time.monotonic() - started
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gunicorn {self.name!r} did not become ready "
                           f"({' '.join(command)}); log tail:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the master and wait for it (kill it if it hangs)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def worker_pid(self) -> int:
        """The pid of the (single) worker: the master's child."""
        assert self.process is not None
        master = self.process.pid
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if not children:
            raise RuntimeError(f"gunicorn {self.name!r} has no worker; log tail:\n{self.log_tail()}")
        return int(children[0])

    def worker_cpu_seconds(self) -> float:
        """User + system CPU seconds the worker has used so far."""
        stat = Path(f"/proc/{self.worker_pid()}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        utime, stime = int(fields[11]), int(fields[12])
        return (utime + stime) / CLOCK_TICKS

    def worker_memory_mib(self) -> dict[str, float]:
        """The worker's current (VmRSS) and peak (VmHWM) resident memory in MiB."""
        found: dict[str, float] = {}
        for line in Path(f"/proc/{self.worker_pid()}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
        return found

    def health(self) -> dict[str, Any]:
        """The JSON of the ready path (ours: /animegan/healthz)."""
        return requests.get(self.url + self.ready_path, timeout=10).json()


def ours(name: str, env: dict[str, str], log_dir: Path) -> GunicornServer:
    """The product: ``gunicorn -c gunicorn.conf.py example_app:app``."""
    return GunicornServer(name, ["-c", "gunicorn.conf.py", "example_app:app"],
                          {"ANIMEGAN_ACCESS_LOG": "", **env}, log_dir,
                          ready_path="/animegan/healthz")


def baseline(name: str, module: str, threads: int, env: dict[str, str],
             log_dir: Path) -> GunicornServer:
    """One of the articles' recipes, ``bench.<module>:app`` under ``--workers 1 --threads N``.

    ``--timeout 120`` matches ours' gunicorn.conf.py, so no server's worker is killed
    while it works through a queue of slow requests.
    """
    return GunicornServer(name, ["--workers", "1", "--threads", str(threads), "--timeout", "120",
                                 f"bench.{module}:app"], env, log_dir, ready_path="/healthz")
