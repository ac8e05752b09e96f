"""A real redis-server on a free loopback port, with its config in a temp folder."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis
from conftest import free_port, need

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """``redis-server`` bound to 127.0.0.1 with no persistence; ``kill()`` and ``start()``
    simulate an outage and its end (the port stays the same)."""

    def __init__(self, folder: Path, maxmemory: str = "64mb") -> None:
        need(Path(REDIS_SERVER).exists(), "redis-server is not installed "
             "(apt-get install redis-server)")
        self.folder = folder
        self.port = free_port()
        self.uri = f"redis://127.0.0.1:{self.port}/0"
        self.maxmemory = maxmemory
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        config = self.folder / "redis.conf"
        config.write_text(
            f"bind 127.0.0.1\nport {self.port}\nprotected-mode yes\n"
            f"dir {self.folder}\nsave \"\"\nappendonly no\n"
            f"maxmemory {self.maxmemory}\nmaxmemory-policy allkeys-lru\n")
        self.log = (self.folder / "redis.log").open("a")
        self.process = subprocess.Popen([REDIS_SERVER, str(config)], stdout=self.log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=0.5).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise AssertionError("redis-server did not start: "
                                         + (self.folder / "redis.log").read_text()[-2000:])
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)

    def kill(self) -> None:
        """Stop the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.log.close()

    def stop(self) -> None:
        self.kill()
