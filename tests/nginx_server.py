"""A real nginx on a free loopback port, running the shipped deploy/nginx.conf in front of
given gunicorn ports, with everything it writes in a temp folder."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from conftest import REPO, free_port, need

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
SHIPPED_SITE = REPO / "deploy" / "nginx.conf"

_LISTEN = re.compile(r"^(\s*)listen\s+[^;]+;", re.MULTILINE)
_UPSTREAM_SERVER = re.compile(r"^(\s*)server\s+127\.0\.0\.1:\d+(\s[^;]*)?;.*\n", re.MULTILINE)


def site_for_ports(site: str, listen_port: int, upstream_ports: Sequence[int]) -> str:
    """The shipped site with its one ``listen`` line on ``127.0.0.1:listen_port`` and its
    ``server 127.0.0.1:PORT ...;`` upstream lines replaced by one per upstream port, each
    with the shipped parameters (max_fails, ...). Nothing else changes."""
    site, listens = _LISTEN.subn(rf"\g<1>listen 127.0.0.1:{listen_port};", site)
    servers = list(_UPSTREAM_SERVER.finditer(site))
    assert listens == 1 and servers, "deploy/nginx.conf no longer has the lines this replaces"
    indent, parameters = servers[0].group(1), servers[0].group(2) or ""
    ours = "".join(f"{indent}server 127.0.0.1:{port}{parameters};\n" for port in upstream_ports)
    return site[:servers[0].start()] + ours + site[servers[-1].end():]


def main_config(folder: Path, site: Path) -> str:
    """A minimal nginx.conf that keeps pid, logs and temp files in ``folder`` and includes
    ``site`` in its ``http`` block (no /etc/nginx file is read)."""
    temp_paths = "\n".join(f"    {kind}_temp_path {folder / kind};"
                           for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # As root, nginx's workers would switch to `nobody`, who cannot write to a temp folder
    # that pytest made for root.
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"{user}worker_processes 1;\npid {folder / 'nginx.pid'};\n"
            f"error_log {folder / 'error.log'} info;\n"
            "events { worker_connections 512; }\n"
            f"http {{\n    access_log {folder / 'access.log'};\n{temp_paths}\n"
            f"    include {site};\n}}\n")


class NginxServer:
    """nginx (master and one worker) with the shipped site in front of ``upstream_ports``."""

    def __init__(self, folder: Path, upstream_ports: Sequence[int]) -> None:
        need(Path(NGINX).exists(), "nginx is not installed (apt-get install nginx)")
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        site = folder / "animegan-site.conf"
        site.write_text(site_for_ports(SHIPPED_SITE.read_text(), self.port, upstream_ports))
        config = folder / "nginx.conf"
        config.write_text(main_config(folder, site))
        self.log = (folder / "nginx.out").open("w")
        # -e: the error log before the config is read (the default is under /var/log)
        self.process = subprocess.Popen(
            [NGINX, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(config),
             "-g", "daemon off;"], stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_until_listening(self) -> None:
        deadline = time.monotonic() + 10
        while self.process.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nginx did not start:\n{self.error_log()[-3000:]}")

    def error_log(self) -> str:
        text = ""
        for name in ("nginx.out", "error.log"):
            path = self.folder / name
            if path.exists():
                text += path.read_text(errors="replace")
        return text

    def stop(self) -> None:
        if self.log.closed:
            return
        self.process.terminate()  # SIGTERM: fast shutdown, workers included
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
