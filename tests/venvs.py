"""Fresh venvs for the packaging tests, and gunicorn served from one of them.

A fresh venv here borrows this test venv's packages (torch above all: a 5 GB install
otherwise) through a ``.pth`` file, which puts them *after* the venv's own site-packages:
whatever is installed into the new venv (the wheel, pinned lowest versions) comes first.
``.pth`` files in the borrowed folder (the editable install's) are not read, so the
checkout's flask_animegan does not come along.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from bench.servers import free_port


def run(*args: object, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 300) -> str:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without settings for Flask or the extension."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANIMEGAN_", "FLASK_", "PYTHONPATH", "VIRTUAL_ENV"))}
    return {**env, **extra}


def borrowing_venv(venv: Path) -> Path:
    """A new venv at ``venv`` that sees this venv's packages after its own; its python."""
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    purelib = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
                   .strip())
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (purelib / "test-venv.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    return python


def pip_install(python: Path, *args: object, timeout: float = 300) -> str:
    """This venv's pip installing into ``python``'s venv (no pip needed there)."""
    return run(sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check",
               "install", "--quiet", *args, timeout=timeout)


@contextmanager
def gunicorn(python: Path, args: Sequence[str], cwd: Path, log: Path,
             env: dict[str, str] | None = None, timeout: float = 120) -> Iterator[str]:
    """``python -m gunicorn ARGS`` in ``cwd`` on a free loopback port, healthy within
    ``timeout`` seconds (``/animegan/healthz`` answers 200); yields its URL, then stops it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen([str(python), "-m", "gunicorn", *args, "-b", f"127.0.0.1:{port}"],
                                  cwd=cwd, env={**clean_env(), **(env or {})}, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert server.poll() is None, f"gunicorn exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"gunicorn not healthy:\n{log.read_text()[-3000:]}"
            try:
                if requests.get(f"{url}/animegan/healthz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
