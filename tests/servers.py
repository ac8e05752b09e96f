"""The real servers the tests start, from bench/servers.py (one set of launchers for the
bench and the tests), with the tests' rule for a missing program: skip locally, fail in CI;
and ``Trickle``, a slow client."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from pathlib import Path

from conftest import need

from bench import servers
from bench.servers import NGINX, REDIS_SERVER, child_pids, proc_status_kib

__all__ = ["NGINX", "REDIS_SERVER", "NginxServer", "RedisServer", "Server", "Trickle",
           "child_pids", "proc_status_kib"]


class Server(servers.GunicornServer):
    """``gunicorn -c gunicorn.conf.py [args] example_app:app``, started at once and healthy
    within 90 s, logging to ``log``; ``cpus`` pins it (and its workers) to those CPUs;
    ``app`` serves another app module with the same config."""

    def __init__(self, env: dict[str, str], log: Path, cpus: set[int] | None = None,
                 args: tuple[str, ...] = (), app: str = "example_app:app") -> None:
        super().__init__(log.stem, ["-c", "gunicorn.conf.py", *args, app], env,
                         log.parent, ready_path="/animegan/healthz", ready_timeout=90,
                         cpus=cpus, log_path=log)
        self.start()

    def worker_rss_kib(self) -> int:
        return proc_status_kib(self.worker_pid(), "VmRSS")

    def worker_peak_kib(self) -> int:
        """The worker's peak resident memory since it started (VmHWM)."""
        return proc_status_kib(self.worker_pid(), "VmHWM")


class RedisServer(servers.RedisServer):
    def __init__(self, folder: Path, maxmemory: str = "64mb", *, shipped: bool = False) -> None:
        need(Path(REDIS_SERVER).exists(), "redis-server is not installed "
             "(apt-get install redis-server)")
        super().__init__(folder, maxmemory, shipped=shipped)


class NginxServer(servers.NginxServer):
    def __init__(self, folder: Path, upstream_ports: Sequence[int]) -> None:
        need(Path(NGINX).exists(), "nginx is not installed (apt-get install nginx)")
        super().__init__(folder, upstream_ports)


class Trickle(threading.Thread):
    """A slow client: it connects from ``address``, sends ``head``, then ``drip`` every
    ``interval`` seconds until stopped, never finishing its request; ``sent`` counts the
    drips, ``closed_by_server`` notes whether the server ever closed the connection (or
    answered: ``answer`` holds the first line of its answer)."""

    def __init__(self, port: int, head: bytes, drip: bytes, *, interval: float = 1.0,
                 address: str = "127.0.0.1") -> None:
        super().__init__(daemon=True)
        self.port, self.head, self.drip = port, head, drip
        self.interval, self.address = interval, address
        self.stopping = threading.Event()
        self.sent = 0
        self.closed_by_server = False
        self.answer = b""

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
                    sock.settimeout(5)
                    self.answer = sock.recv(4096).split(b"\r\n", 1)[0]
                    self.closed_by_server = True
                    return
                except BlockingIOError:
                    pass  # still open, nothing said
                sock.sendall(self.drip)
                self.sent += 1
