"""Admission: at most 1 + ANIMEGAN_MAX_QUEUE web conversions in the app at once, counted
once their upload has arrived (waiting to be decoded, waiting for the model); the next gets
503 with Retry-After before its body is read, and every way a request ends lets the next
one in. Real threads against test apps; gunicorn's side is in test_server_overload.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from conftest import REPO, convert, photo, photo_bytes

MAX_QUEUE = 1
ADMITTED = 1 + MAX_QUEUE
ENDPOINTS = ("/animegan/convert", "/animegan/upload")


class Body(io.RawIOBase):
    """A request body that notes whether the app read it, and, when ``held``, arrives only
    once ``release`` is set (``disconnect``: the client is gone by then, the body short)."""

    def __init__(self, data: bytes, *, held: bool = False, disconnect: bool = False) -> None:
        self.data, self.held, self.disconnect = io.BytesIO(data), held, disconnect
        self.size = len(data)
        self.reading, self.release = threading.Event(), threading.Event()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:  # werkzeug notes the position
        return self.data.seek(offset, whence)

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        self.reading.set()
        if self.held and not self.release.wait(30):
            raise TimeoutError("the test never released the body")
        if self.disconnect:
            return 0
        chunk = self.data.read(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)


def multipart(data: bytes) -> tuple[bytes, str]:
    boundary = "admission-test"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; "
            f"filename=\"p.jpg\"\r\nContent-Type: image/jpeg\r\n\r\n").encode()
    return body + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def send(app, endpoint: str, body: Body, content_type: str, query: str = ""):
    return app.test_client().post(endpoint + query, input_stream=body,
                                  content_length=body.size, content_type=content_type)


def upload_body(endpoint: str, data: bytes, **kwargs: bool) -> tuple[Body, str]:
    if endpoint.endswith("/upload"):
        data, content_type = multipart(data)
        return Body(data, **kwargs), content_type
    return Body(data, **kwargs), "image/jpeg"


class Background(threading.Thread):
    """One request in a thread of its own; ``response`` once it is answered."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call, self.response = call, None

    def run(self) -> None:
        self.response = self.call()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def admitted(app) -> int:
    return app.extensions["animegan"].admission.status()["admitted"]


def start_request(app, endpoint: str, data: bytes, **kwargs: bool) -> tuple[Body, Background]:
    body, content_type = upload_body(endpoint, data, **kwargs)
    request = Background(lambda: send(app, endpoint, body, content_type))
    request.start()
    return body, request


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_conversion_after_the_admitted_ones_gets_503_before_its_body_is_read(
        make_app, endpoint, monkeypatch):
    """One conversion waits for the model, one for the decoder (the test holds both): the
    app is full, and the next upload is refused at once, unread."""
    monkeypatch.setattr("flask_animegan.config.available_cpus", lambda: 1)  # one decode slot
    app = make_app(ANIMEGAN_MAX_QUEUE=MAX_QUEUE)
    service = app.extensions["animegan"]
    held: list[Background] = []
    with service.engine.gate.slot():
        held.append(start_request(app, "/animegan/convert", photo_bytes())[1])
        wait_for(lambda: service.engine.status()["queued"] == 1, "the model queue")
        with service.decoder.gate.slot():
            held.append(start_request(app, "/animegan/convert", photo_bytes())[1])
            wait_for(lambda: service.decoder.gate.pending == 2, "the decode queue")
            assert admitted(app) == ADMITTED == 2
            health = app.test_client().get("/animegan/healthz").json
            assert health["admission"]["admitted"] == ADMITTED == health["admission"]["capacity"]
            began = time.monotonic()
            body, content_type = upload_body(endpoint, photo_bytes())
            refused = send(app, endpoint, body, content_type)
            assert time.monotonic() - began < 5  # at once, not after a wait
            assert refused.status_code == 503
            assert int(refused.headers["Retry-After"]) >= 1
            assert not body.reading.is_set(), "the refused upload was read"
            message = refused.json["error"] if endpoint.endswith("/convert") else refused.text
            assert "busy" in message and "try again in" in message
    for request in held:
        request.join(60)
        assert request.response is not None and request.response.status_code == 200
    assert admitted(app) == 0
    assert app.extensions["animegan"].admission.status()["refused"] == 1
    assert convert(app.test_client(), photo_bytes()).status_code == 200


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_uploads_still_arriving_take_no_place(make_app, endpoint):
    """More uploads than the app admits, their bodies still arriving: none counts, and
    another client's conversion is converted meanwhile; then each of them is answered."""
    app = make_app(ANIMEGAN_MAX_QUEUE=MAX_QUEUE)
    held = [start_request(app, endpoint, photo_bytes(), held=True) for _ in range(ADMITTED + 1)]
    for body, _ in held:
        wait_for(body.reading.is_set, "a held upload reading its body")
    assert admitted(app) == 0
    assert convert(app.test_client(), photo_bytes()).status_code == 200
    for body, _ in held:
        body.release.set()
    for _, request in held:
        request.join(60)
        assert request.response is not None and request.response.status_code in (200, 303, 503)
    assert admitted(app) == 0


class SlowBody(io.RawIOBase):
    """A body that sends ``chunk`` bytes every ``interval`` seconds."""

    def __init__(self, data: bytes, chunk: int, interval: float) -> None:
        self.data, self.chunk, self.interval = io.BytesIO(data), chunk, interval
        self.size = len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:  # werkzeug notes the position
        return self.data.seek(offset, whence)

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        time.sleep(self.interval)
        chunk = self.data.read(min(len(buffer), self.chunk))
        buffer[:len(chunk)] = chunk
        return len(chunk)


# werkzeug leaves the spooled file of a multipart body cut mid-way to the garbage
# collector, which warns (ResourceWarning) as it closes it
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_upload_slower_than_the_least_rate_is_cut_with_408(make_app, endpoint, monkeypatch):
    monkeypatch.setattr("flask_animegan.web.bodies.UPLOAD_GRACE_SECONDS", 0.3)
    app = make_app()
    data, content_type = photo_bytes(), "image/jpeg"
    if endpoint.endswith("/upload"):
        data, content_type = multipart(data)
    slow = app.test_client().post(endpoint, input_stream=SlowBody(data, 64, 0.1),
                                  content_length=len(data), content_type=content_type)
    assert slow.status_code == 408, slow.get_data(as_text=True)[:300]
    assert "too slowly" in slow.get_data(as_text=True)
    assert admitted(app) == 0
    # at the least rate and faster, the same upload arrives whole and is converted
    fast = app.test_client().post(endpoint, input_stream=SlowBody(data, 64 << 10, 0.1),
                                  content_length=len(data), content_type=content_type)
    assert fast.status_code in (200, 303), fast.get_data(as_text=True)[:300]


def _host_hook_fails(app) -> None:
    @app.before_request
    def fail() -> None:
        raise RuntimeError("the host's before_request failed")


# How a conversion's request can end: (config, query, body, content type, host setup,
# expected status). Each ends ADMITTED + 1 times in a row; one leak would refuse the last.
OUTCOMES = {
    "converted": ({}, "", lambda: photo_bytes(), "image/jpeg", None, 200),
    "not an image": ({}, "", lambda: b"not an image" * 10, "image/jpeg", None, 400),
    "bad parameter": ({}, "?size=abc", lambda: photo_bytes(), "image/jpeg", None, 400),
    "unsupported type": ({}, "", lambda: photo_bytes(), "text/plain", None, 415),
    "too large": ({"ANIMEGAN_MAX_UPLOAD_BYTES": 1000}, "", lambda: photo_bytes(),
                  "image/jpeg", None, 413),
    "unknown style": ({}, "?style=nope", lambda: photo_bytes(), "image/jpeg", None, 404),
    "rate limited": ({"ANIMEGAN_RATE_LIMIT": "1 per minute"}, "", lambda: photo_bytes(),
                     "image/jpeg", None, 429),
    "client disconnected": ({}, "", "disconnect", "image/jpeg", None, 400),
    "the host's code failed": ({"TESTING": False}, "", lambda: photo_bytes(), "image/jpeg",
                               _host_hook_fails, 500),
}


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_every_way_a_conversion_ends_lets_the_next_one_in(make_app, outcome):
    config, query, make, content_type, setup, status = OUTCOMES[outcome]
    app = make_app(ANIMEGAN_MAX_QUEUE=MAX_QUEUE, **config)
    if setup is not None:
        setup(app)
    client = app.test_client()
    statuses = []
    for _ in range(ADMITTED + 1):
        if make == "disconnect":
            body = Body(photo_bytes(), disconnect=True)
        else:
            body = Body(make())
        response = client.post(f"/animegan/convert{query}", input_stream=body,
                               content_length=body.size, content_type=content_type)
        statuses.append(response.status_code)
    assert set(statuses) - {200} == ({status} - {200}) and statuses[-1] == status, statuses
    assert admitted(app) == 0


def test_the_python_api_and_the_cli_are_not_admitted(make_app, tmp_path):
    """convert() and `flask animegan convert` run beside full admission: they hold no
    server thread of a web client."""
    app = make_app(ANIMEGAN_MAX_QUEUE=0)
    service = app.extensions["animegan"]
    ticket = service.admission.enter()  # one web conversion in: the app is full
    try:
        assert service.convert(photo(), size=64).size[0] == 64
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "p.jpg").write_bytes(photo_bytes())
        result = app.test_cli_runner().invoke(args=[
            "animegan", "convert", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
            "--size", "64"])
        assert result.exit_code == 0, result.output
        assert list((tmp_path / "out").iterdir())
        assert convert(app.test_client(), photo_bytes()).status_code == 503
    finally:
        ticket.leave()
    assert convert(app.test_client(), photo_bytes()).status_code == 200


@pytest.mark.parametrize(("environ", "threads"), [
    ({}, 11),  # today's default: 1 running + 2 queued, 3 + 4 uploads arriving, 1 free
    ({"ANIMEGAN_MAX_QUEUE": "0"}, 7),
    ({"ANIMEGAN_MAX_QUEUE": "8"}, 23),
    ({"ANIMEGAN_MAX_QUEUE": "8", "ANIMEGAN_SERVER_THREADS": "16"}, 16),  # set: kept as given
])
def test_gunicorn_conf_derives_its_threads_from_the_queue(environ, threads):
    """gunicorn.conf.py, loaded as gunicorn loads it, derives its thread count from the
    settings; it imports the package's settings module (flask_animegan.gunicorn_conf) and
    nothing else of the package (torch would come with it)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("ANIMEGAN_")}
    code = ("import json, runpy, sys; conf = runpy.run_path('gunicorn.conf.py'); "
            "print(json.dumps([conf['threads'], sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'flask', 'flask_animegan') "
            "and m not in ('flask_animegan', 'flask_animegan.config', "
            "'flask_animegan.gunicorn_conf'))]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, **environ},
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == [threads, []]
