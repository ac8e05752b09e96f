"""``flask animegan pull NAME`` against a real HTTP server on the loopback interface.

The server (``http.server`` in a thread, on a port the OS picks) serves weights files
the tests generate and records every request, so a test can tell whether a download
happened. Each test gets its own empty models folder.
"""

from __future__ import annotations

import gc
import hashlib
import shutil
import subprocess
import threading
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from click.testing import Result
from conftest import free_port, need, save_random_generator
from flask import Flask

from flask_animegan import Generator, load_generator
from flask_animegan.runtime.catalog import NONCOMMERCIAL, OFFICIAL_STYLES
from flask_animegan.runtime.weights import file_git_blob_sha1

EXTRA_LICENCE = "CC-BY-4.0"


def blob_sha1(data: bytes) -> str:
    """The git blob SHA-1 of ``data``, computed here independently of the package."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Route:
    body: bytes
    content_length: int | None = None  # None: the body's real length
    raw: bool = False  # send ``body`` as the whole response, status line and headers included


class _Handler(BaseHTTPRequestHandler):
    server: WeightsServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.record(self.path)
        route = self.server.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        if route.raw:
            self.wfile.write(route.body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(route.content_length or len(route.body)))
        self.end_headers()
        # a Content-Length above len(body) makes this a truncated download: the
        # connection closes (HTTP/1.0) right after the short body
        self.wfile.write(route.body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # keep the test output clean; requests are recorded instead


class WeightsServer(ThreadingHTTPServer):
    """Serves ``routes`` (path -> Route) and records the path of every GET."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.requests: list[str] = []
        self._lock = threading.Lock()

    @property
    def base(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def serve(self, path: str, body: bytes, content_length: int | None = None,
              raw: bool = False) -> str:
        """Serve ``body`` at ``path``; returns its URL."""
        self.routes[path] = Route(body, content_length, raw)
        return self.base + path

    def record(self, path: str) -> None:
        with self._lock:
            self.requests.append(path)


@pytest.fixture
def server() -> Iterator[WeightsServer]:
    httpd = WeightsServer()
    thread = threading.Thread(target=httpd.serve_forever, name="weights-server", daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Talk to 127.0.0.1 directly, whatever proxy the environment names.

    urllib caches its default opener (and the proxies it read from the environment)
    on first use, so that cache is cleared for the test and restored afterwards.
    """
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setattr(urllib.request, "_opener", None)


@pytest.fixture(scope="session")
def weights_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real, loadable generator state dict (seed 7), as the bytes a server would send."""
    path = save_random_generator(tmp_path_factory.mktemp("served") / "served.pt", seed=7)
    return path.read_bytes()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An empty models folder of this test's own."""
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def pull(make_app: Callable[..., Flask], folder: Path) -> Callable[..., Result]:
    """Run ``flask animegan pull ARGS...`` in a fresh app using ``folder``."""

    def run(*args: str, **config: object) -> Result:
        app = make_app(ANIMEGAN_MODELS_DIR=str(folder), **config)
        return app.test_cli_runner().invoke(args=["animegan", "pull", *args])

    return run


def extra(name: str, url: str, sha1: str, **more: object) -> dict[str, dict[str, object]]:
    return {name: {"url": url, "sha1": sha1, "licence": EXTRA_LICENCE, **more}}


@dataclass
class Outcome:
    exit_code: int
    output: str
    uncaught: str | None  # repr of an exception that escaped click's error handling
    resource_warnings: list[str]


def pull_outcome(pull: Callable[..., Result], *args: str, **config: object) -> Outcome:
    """Run a pull that should fail, then collect garbage to catch leaked sockets.

    A failed download's exception chain sits in a reference cycle (traceback -> frame
    -> exception), so an unclosed response only shows up when gc runs; running it here
    pins a leak on the test that caused it.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        result = pull(*args, **config)
        escaped = result.exception
        uncaught = None if escaped is None or isinstance(escaped, SystemExit) else repr(escaped)
        outcome = Outcome(result.exit_code, result.output, uncaught, [])
        del result, escaped
        gc.collect()
    outcome.resource_warnings = [str(w.message) for w in caught
                                 if issubclass(w.category, ResourceWarning)]
    return outcome


def assert_clean_failure(outcome: Outcome, *, leak_free: bool = True) -> None:
    """Non-zero exit through click's error path (not a traceback), no socket left open."""
    assert outcome.exit_code != 0, outcome.output
    assert outcome.uncaught is None, f"uncaught {outcome.uncaught}; output: {outcome.output}"
    assert "\nError: " in f"\n{outcome.output}", outcome.output
    if leak_free:
        assert outcome.resource_warnings == []


def test_pull_installs_a_verified_file(pull: Callable[..., Result], server: WeightsServer,
                                       folder: Path, weights_bytes: bytes) -> None:
    url = server.serve("/files/mystyle.pt", weights_bytes)
    result = pull("mystyle", ANIMEGAN_EXTRA_STYLES=extra("mystyle", url,
                                                         blob_sha1(weights_bytes)))
    assert result.exit_code == 0, result.output
    assert server.requests == ["/files/mystyle.pt"]
    installed = folder / "mystyle.pt"
    assert sorted(p.name for p in folder.iterdir()) == ["mystyle.pt"]  # no .part left
    assert installed.read_bytes() == weights_bytes
    assert "hash verified" in result.output
    assert str(installed) in result.output
    model = load_generator(installed)
    torch.manual_seed(7)  # the seed the served file was made with
    expected = Generator().state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_pulled_style_is_picked_up_without_restart(make_app: Callable[..., Flask],
                                                   server: WeightsServer, folder: Path,
                                                   weights_bytes: bytes) -> None:
    url = server.serve("/mystyle.pt", weights_bytes)
    app = make_app(ANIMEGAN_MODELS_DIR=str(folder),
                   ANIMEGAN_EXTRA_STYLES=extra("mystyle", url, blob_sha1(weights_bytes)))
    runner = app.test_cli_runner()
    assert runner.invoke(args=["animegan", "pull", "mystyle"]).exit_code == 0
    listing = runner.invoke(args=["animegan", "styles"])
    assert listing.exit_code == 0, listing.output
    line = next(ln for ln in listing.output.splitlines() if ln.startswith("mystyle "))
    assert "installed" in line and "pull with" not in line


def test_pull_prints_the_licence(pull: Callable[..., Result], server: WeightsServer,
                                 weights_bytes: bytes) -> None:
    url = server.serve("/mystyle.pt", weights_bytes)
    result = pull("mystyle", ANIMEGAN_EXTRA_STYLES=extra(
        "mystyle", url, blob_sha1(weights_bytes), description="Seeded test weights."))
    assert result.exit_code == 0, result.output
    assert f"licence: {EXTRA_LICENCE}" in result.output
    assert "Seeded test weights." in result.output


@pytest.mark.parametrize("via", ["option", "config"])
def test_wrong_hash_from_a_mirror_installs_nothing(pull: Callable[..., Result],
                                                   server: WeightsServer, folder: Path,
                                                   weights_bytes: bytes, via: str) -> None:
    server.serve("/weights/paprika.pt", weights_bytes)
    mirror = server.base + "/weights"
    if via == "option":
        result = pull_outcome(pull, "paprika", "--base-url", mirror)
    else:
        result = pull_outcome(pull, "paprika", ANIMEGAN_WEIGHTS_BASE_URL=mirror)
    assert server.requests == ["/weights/paprika.pt"]  # the mirror, not GitHub
    assert_clean_failure(result)
    assert "does not match the pinned hash" in result.output
    assert OFFICIAL_STYLES["paprika"].sha1 in result.output
    assert blob_sha1(weights_bytes) in result.output  # what was actually received
    assert f"licence: {NONCOMMERCIAL}" in result.output  # the licence is shown up front
    assert list(folder.iterdir()) == []


def test_base_url_option_wins_over_config(pull: Callable[..., Result], server: WeightsServer,
                                          folder: Path, weights_bytes: bytes) -> None:
    server.serve("/option/paprika.pt", weights_bytes)
    result = pull_outcome(pull, "paprika", "--base-url", server.base + "/option/",
                  ANIMEGAN_WEIGHTS_BASE_URL=server.base + "/config")
    assert server.requests == ["/option/paprika.pt"]  # trailing slash handled too
    assert_clean_failure(result)
    assert list(folder.iterdir()) == []


def test_extra_style_overriding_an_official_one_uses_its_own_pin(
        pull: Callable[..., Result], server: WeightsServer, folder: Path,
        weights_bytes: bytes) -> None:
    url = server.serve("/my-paprika.pt", weights_bytes)
    result = pull("paprika", ANIMEGAN_EXTRA_STYLES=extra("paprika", url,
                                                         blob_sha1(weights_bytes)))
    assert result.exit_code == 0, result.output
    assert f"licence: {EXTRA_LICENCE}" in result.output
    assert (folder / "paprika.pt").read_bytes() == weights_bytes


def test_truncated_download_installs_nothing(pull: Callable[..., Result], server: WeightsServer,
                                             folder: Path, weights_bytes: bytes) -> None:
    half = weights_bytes[: len(weights_bytes) // 2]
    url = server.serve("/short.pt", half, content_length=len(weights_bytes))
    # the pin is the full file's, so only the truncation check can explain the failure
    result = pull_outcome(pull, "short",
                          ANIMEGAN_EXTRA_STYLES=extra("short", url, blob_sha1(weights_bytes)))
    assert server.requests == ["/short.pt"]
    assert_clean_failure(result)
    assert "truncated" in result.output
    assert f"got {len(half)} of {len(weights_bytes)} bytes" in result.output
    assert list(folder.iterdir()) == []


def test_network_error_installs_nothing(pull: Callable[..., Result], folder: Path,
                                        weights_bytes: bytes) -> None:
    url = f"http://127.0.0.1:{free_port()}/nobody-listens.pt"
    result = pull_outcome(pull, "gone",
                          ANIMEGAN_EXTRA_STYLES=extra("gone", url, blob_sha1(weights_bytes)))
    assert_clean_failure(result)
    assert f"could not download {url}" in result.output
    assert "refused" in result.output.lower()
    assert "ANIMEGAN_WEIGHTS_BASE_URL" in result.output  # says what to do next
    assert list(folder.iterdir()) == []


def test_http_404_installs_nothing(pull: Callable[..., Result], server: WeightsServer,
                                   folder: Path, weights_bytes: bytes) -> None:
    url = server.base + "/missing.pt"
    result = pull_outcome(pull, "missing",
                          ANIMEGAN_EXTRA_STYLES=extra("missing", url, blob_sha1(weights_bytes)))
    assert server.requests == ["/missing.pt"]
    assert_clean_failure(result)
    assert f"could not download {url}" in result.output
    assert "Not Found" in result.output
    assert list(folder.iterdir()) == []


def test_http_error_response_is_closed(pull: Callable[..., Result], server: WeightsServer,
                                       weights_bytes: bytes) -> None:
    url = server.base + "/missing.pt"
    result = pull_outcome(pull, "missing",
                          ANIMEGAN_EXTRA_STYLES=extra("missing", url, blob_sha1(weights_bytes)))
    assert result.exit_code != 0
    assert result.resource_warnings == []


@pytest.mark.parametrize("reply", ["bad-status-line", "truncated-chunked"])
def test_malformed_http_reply_is_a_clean_error(pull: Callable[..., Result],
                                               server: WeightsServer, folder: Path,
                                               weights_bytes: bytes, reply: str) -> None:
    if reply == "bad-status-line":
        raw = b"this is not HTTP\r\n\r\n"
    else:  # a chunked body cut off inside its first chunk
        raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(weights_bytes) + weights_bytes[:1000])
    url = server.serve("/odd.pt", raw, raw=True)
    result = pull_outcome(pull, "odd",
                          ANIMEGAN_EXTRA_STYLES=extra("odd", url, blob_sha1(weights_bytes)))
    assert server.requests == ["/odd.pt"]
    assert list(folder.iterdir()) == []  # holds today: the temp file is removed either way
    assert_clean_failure(result)
    assert f"could not download {url}" in result.output


@pytest.mark.parametrize("name", ["nosuch", "../paprika", "test_style"])
def test_unknown_style_lists_the_pullable_ones(pull: Callable[..., Result],
                                               server: WeightsServer, folder: Path,
                                               weights_bytes: bytes, name: str) -> None:
    url = server.serve("/mystyle.pt", weights_bytes)
    result = pull_outcome(pull, name,
                          ANIMEGAN_EXTRA_STYLES=extra("mystyle", url, blob_sha1(weights_bytes)))
    assert_clean_failure(result)
    assert f"unknown style {name!r}" in result.output
    pullable = result.output.split("pullable styles:", 1)[1]
    for known in [*OFFICIAL_STYLES, "mystyle"]:
        assert known in pullable
    assert server.requests == []
    assert list(folder.iterdir()) == []
    assert not (folder.parent / "paprika.pt").exists()


def test_installed_style_is_not_downloaded_again_unless_forced(
        pull: Callable[..., Result], server: WeightsServer, folder: Path,
        weights_bytes: bytes) -> None:
    url = server.serve("/mystyle.pt", weights_bytes)
    styles = extra("mystyle", url, blob_sha1(weights_bytes))
    installed = folder / "mystyle.pt"
    installed.write_bytes(b"an older copy")

    again = pull("mystyle", ANIMEGAN_EXTRA_STYLES=styles)
    assert again.exit_code == 0, again.output
    assert "already installed" in again.output
    assert "--force" in again.output
    assert server.requests == []
    assert installed.read_bytes() == b"an older copy"

    forced = pull("mystyle", "--force", ANIMEGAN_EXTRA_STYLES=styles)
    assert forced.exit_code == 0, forced.output
    assert server.requests == ["/mystyle.pt"]
    assert installed.read_bytes() == weights_bytes
    assert sorted(p.name for p in folder.iterdir()) == ["mystyle.pt"]


def test_forced_pull_with_a_bad_download_keeps_the_installed_file(
        pull: Callable[..., Result], server: WeightsServer, folder: Path,
        weights_bytes: bytes) -> None:
    url = server.serve("/mystyle.pt", b"not the pinned file")
    installed = folder / "mystyle.pt"
    installed.write_bytes(weights_bytes)
    result = pull_outcome(pull, "mystyle", "--force",
                          ANIMEGAN_EXTRA_STYLES=extra("mystyle", url, blob_sha1(weights_bytes)))
    assert server.requests == ["/mystyle.pt"]
    assert_clean_failure(result)
    assert installed.read_bytes() == weights_bytes
    assert sorted(p.name for p in folder.iterdir()) == ["mystyle.pt"]


@pytest.mark.parametrize("data", [b"", b"hello\n", bytes(range(256)) * 300],
                         ids=["empty", "text", "binary"])
def test_git_blob_sha1_matches_git_hash_object(tmp_path: Path, data: bytes) -> None:
    git = shutil.which("git")
    need(git is not None, "git is not installed")
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    expected = subprocess.run([git, "hash-object", "--no-filters", str(path)], check=True,
                              capture_output=True, text=True, cwd=tmp_path).stdout.strip()
    assert blob_sha1(data) == expected
    assert file_git_blob_sha1(path) == expected



def test_pull_of_a_style_whose_licence_is_not_allowed_refuses(
        pull: Callable[..., Result], server: WeightsServer, folder: Path,
        weights_bytes: bytes) -> None:
    """ANIMEGAN_ALLOWED_LICENCES: nothing is downloaded, and the message names the licence;
    a style under an allowed licence still installs from the same server."""
    mirror = server.base + "/weights"
    server.serve("/weights/paprika.pt", weights_bytes)
    url = server.serve("/mystyle.pt", weights_bytes)
    config = {"ANIMEGAN_WEIGHTS_BASE_URL": mirror, "ANIMEGAN_ALLOWED_LICENCES": ["MIT", "CC-BY-4.0"],
              "ANIMEGAN_EXTRA_STYLES": extra("mystyle", url, blob_sha1(weights_bytes))}
    result = pull_outcome(pull, "paprika", **config)
    assert_clean_failure(result)
    assert (f"style 'paprika' is not offered here: its licence {NONCOMMERCIAL} is not among "
            "this site's allowed licences (ANIMEGAN_ALLOWED_LICENCES); not downloaded") in result.output
    assert server.requests == [] and list(folder.iterdir()) == []
    assert pull("mystyle", **config).exit_code == 0
    assert server.requests == ["/mystyle.pt"]
    assert (folder / "mystyle.pt").read_bytes() == weights_bytes
