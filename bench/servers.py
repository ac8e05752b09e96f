"""Real servers on loopback for the bench and the tests: gunicorn, redis-server, nginx.

Each runs on a free 127.0.0.1 port with its config and logs in a given folder, raises
with its log's tail when it does not come up, and stops with ``stop()`` or a ``with``.
``Missing`` says a binary is not installed (a skip in the tests, a failure in CI).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import requests

REPO = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).with_name("gunicorn")
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Missing(RuntimeError):
    """A server's program is not installed; the message says how to install it."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_setup(cpus: set[int] | None) -> Callable[[], None]:
    """Before exec: SIGTERM the child when its parent's starting *thread* dies (start
    servers from one that outlives them), and pin it to ``cpus``."""

    def setup() -> None:
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def _stop(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM ``process`` and wait for it (kill it if it hangs)."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``process`` accepts connections on ``port`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _tail(*paths: Path, chars: int = 3000) -> str:
    text = "".join(path.read_text(errors="replace") for path in paths if path.exists())
    return text[-chars:] or "(no log)"


class _Server:
    """start() in __init__'s caller or a ``with`` block; stop() is safe to call twice."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        raise NotImplementedError


# --- gunicorn ---------------------------------------------------------------------------

class GunicornServer(_Server):
    """One gunicorn master with one worker, run from the repository root."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path, *,
                 ready_path: str, ready_timeout: float = 180.0, cpus: set[int] | None = None,
                 log_path: Path | None = None) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_path or log_dir / f"gunicorn-{name}.log"
        self.ready_path = ready_path
        self.ready_timeout = ready_timeout
        self.cpus = cpus
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> GunicornServer:
        if self.process is None:
            self.start()
        return self

    def start(self) -> None:
        """Launch gunicorn and wait until ``ready_path`` answers 200; raise with the log tail if not."""
        command = [str(GUNICORN), *self.args, "-b", f"127.0.0.1:{self.port}"]
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, env={**os.environ, **self.env},
                                            stdout=log, stderr=subprocess.STDOUT,
                                            preexec_fn=_child_setup(self.cpus))
        while time.monotonic() - started < self.ready_timeout:
            if self.process.poll() is not None:
                break
            try:
                if requests.get(self.url + self.ready_path, timeout=10).status_code == 200:
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
        _stop(self.process, 60)

    def output(self) -> str:
        """The server's whole log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, for error messages."""
        return _tail(self.log_path, chars=chars)

    def wait_for_output(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        """The first match of the regular expression ``pattern`` in the log, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(pattern, self.output(), re.MULTILINE)
            if match or time.monotonic() > deadline:
                assert match, f"{pattern!r} not in the log:\n{self.log_tail()}"
                return match
            time.sleep(0.1)

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
        pid = self.worker_pid()
        return {field: proc_status_kib(pid, field) / 1024 for field in ("VmRSS", "VmHWM")}

    def health(self) -> dict[str, Any]:
        """The JSON of the ready path (ours: /animegan/healthz)."""
        return requests.get(self.url + self.ready_path, timeout=10).json()  # type: ignore[no-any-return]


def ours(name: str, env: dict[str, str], log_dir: Path) -> GunicornServer:
    """The product: ``gunicorn -c gunicorn.conf.py example_app:app``."""
    return GunicornServer(name, ["-c", "gunicorn.conf.py", "example_app:app"],
                          {"ANIMEGAN_ACCESS_LOG": "", **env}, log_dir,
                          ready_path="/animegan/healthz")


def baseline(name: str, module: str, threads: int, env: dict[str, str],
             log_dir: Path) -> GunicornServer:
    """One of the articles' recipes, ``bench.<module>:app``, with our gunicorn timeout."""
    return GunicornServer(name, ["--workers", "1", "--threads", str(threads), "--timeout", "120",
                                 f"bench.{module}:app"], env, log_dir, ready_path="/healthz")


def proc_status_kib(pid: int, field: str) -> int:
    """A memory field of /proc/PID/status (VmRSS, VmHWM, ...) in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith(f"{field}:")))


def child_pids(pid: int) -> list[int]:
    """The live children of process ``pid`` (of any of its threads), grandchildren included."""
    found: list[int] = []
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


# --- redis-server -------------------------------------------------------------------------

class RedisServer(_Server):
    """``redis-server`` on 127.0.0.1 without persistence; ``kill()`` and ``start()``
    make an outage. ``shipped`` runs deploy/redis.conf instead of a minimal config."""

    def __init__(self, folder: Path, maxmemory: str = "64mb", *, shipped: bool = False) -> None:
        if not Path(REDIS_SERVER).exists():
            raise Missing("redis-server is not installed (apt-get install redis-server)")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.uri = f"redis://127.0.0.1:{self.port}/0"
        self.maxmemory = maxmemory
        self.shipped = shipped
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def config(self) -> str:
        if self.shipped:
            config = (REPO / "deploy" / "redis.conf").read_text()
            config = re.sub(r"^bind .*$", "bind 127.0.0.1", config, flags=re.MULTILINE)
            config = re.sub(r"^port \d+$", f"port {self.port}", config, flags=re.MULTILINE)
            return config + f"\ndir {self.folder}\n"
        return (f"bind 127.0.0.1\nport {self.port}\nprotected-mode yes\n"
                f"dir {self.folder}\nsave \"\"\nappendonly no\n"
                f"maxmemory {self.maxmemory}\nmaxmemory-policy allkeys-lru\n")

    def start(self) -> None:
        config = self.folder / "redis.conf"
        config.write_text(self.config())
        log = self.folder / "redis.log"
        with log.open("ab") as out:
            self.process = subprocess.Popen([REDIS_SERVER, str(config)], stdout=out,
                                            stderr=subprocess.STDOUT,
                                            preexec_fn=_child_setup(None))
        if not _wait_for_port(self.port, self.process, 10):
            self.kill()
            raise RuntimeError(f"redis-server did not start:\n{_tail(log, chars=2000)}")

    def client(self) -> Any:
        """A redis-py client of this server (redis-py is imported only here)."""
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        self.kill()


# --- nginx ---------------------------------------------------------------------------------

SHIPPED_SITE = REPO / "deploy" / "nginx.conf"
_LISTEN = re.compile(r"^(\s*)listen\s+[^;]+;", re.MULTILINE)
_UPSTREAM_SERVER = re.compile(r"^(\s*)server\s+127\.0\.0\.1:\d+(\s[^;]*)?;.*\n", re.MULTILINE)
_ACCESS_LOG = re.compile(r"^(\s*)access_log\s+\S+(\s[^;]*)?;", re.MULTILINE)


def site_for_ports(site: str, listen_port: int, upstream_ports: Sequence[int],
                   access_log: Path | None = None) -> str:
    """The shipped site listening on ``listen_port`` with one upstream line per port and
    its access log at ``access_log`` (``off`` without one); nothing else changes."""
    site, listens = _LISTEN.subn(rf"\g<1>listen 127.0.0.1:{listen_port};", site)
    site = _ACCESS_LOG.sub(lambda m: f"{m.group(1)}access_log {access_log}{m.group(2) or ''};"
                           if access_log else f"{m.group(1)}access_log off;", site)
    servers = list(_UPSTREAM_SERVER.finditer(site))
    assert listens == 1 and servers, "deploy/nginx.conf no longer has the lines this replaces"
    indent, parameters = servers[0].group(1), servers[0].group(2) or ""
    ours = "".join(f"{indent}server 127.0.0.1:{port}{parameters};\n" for port in upstream_ports)
    return site[:servers[0].start()] + ours + site[servers[-1].end():]


def main_config(folder: Path, site: Path, access_log: bool = True) -> str:
    """A minimal nginx.conf that keeps its files in ``folder`` and includes ``site``."""
    temp_paths = "\n".join(f"    {kind}_temp_path {folder / kind};"
                           for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # as root, workers switch to `nobody`, who cannot write to root's temp folder
    user = "user root;\n" if os.geteuid() == 0 else ""
    access = folder / "access.log" if access_log else "off"
    return (f"{user}worker_processes 1;\npid {folder / 'nginx.pid'};\n"
            f"error_log {folder / 'error.log'} info;\n"
            "events { worker_connections 512; }\n"
            f"http {{\n    access_log {access};\n{temp_paths}\n"
            f"    include {site};\n}}\n")


class NginxServer(_Server):
    """nginx running the shipped deploy/nginx.conf in front of ``upstream_ports``."""

    def __init__(self, folder: Path, upstream_ports: Sequence[int], *,
                 access_log: bool = True) -> None:
        if not Path(NGINX).exists():
            raise Missing("nginx is not installed (apt-get install nginx)")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        site = folder / "animegan-site.conf"
        site.write_text(site_for_ports(SHIPPED_SITE.read_text(), self.port, upstream_ports,
                                       folder / "access.log" if access_log else None))
        config = folder / "nginx.conf"
        config.write_text(main_config(folder, site, access_log))
        with (folder / "nginx.out").open("wb") as out:
            # -e: the error log before the config is read (the default is under /var/log)
            self.process = subprocess.Popen(
                [NGINX, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(config),
                 "-g", "daemon off;"], stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(None))
        if not _wait_for_port(self.port, self.process, 10):
            self.stop()
            raise RuntimeError(f"nginx did not start:\n{self.error_log()[-3000:]}")

    def error_log(self) -> str:
        """Everything nginx has logged so far (its output, then its error log)."""
        return _tail(self.folder / "nginx.out", self.folder / "error.log", chars=10**8)

    def stop(self) -> None:
        _stop(self.process, 10)  # SIGTERM: fast shutdown, workers included
