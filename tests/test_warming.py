"""A worker that has no old worker to keep serving (a first start, a restart) answers at
once while its model loads in the background: conversions and samples 503 with
Retry-After, /healthz 503 "warming"; then everything as usual. Through the Flask client
(the warm-up held at its lock) and through the real gunicorn with the shipped config."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from conftest import REPO, TEST_CONFIG, convert, free_port, photo_bytes
from flask import Flask

from flask_animegan import AnimeGAN


def cold_app(models_dir: Path, openvino_cache: Path, **config: object) -> Flask:
    """An app on the test config that has not warmed up (as a gunicorn worker right after
    it imported the app)."""
    app = Flask("cold_host")
    app.config.update(TEST_CONFIG, ANIMEGAN_MODELS_DIR=str(models_dir),
                      ANIMEGAN_MODEL_CACHE_DIR=str(openvino_cache), **config)
    AnimeGAN(app)
    return app


def test_while_warming_conversions_and_health_answer_503_at_once(models_dir, openvino_cache):
    app = cold_app(models_dir, openvino_cache, ANIMEGAN_SAMPLE_SIZE=64)
    service = app.extensions["animegan"]
    client = app.test_client()
    with service._warm_lock:  # a warm-up in progress holds it for its seconds
        thread = service.warm_up_in_background()
        began = time.monotonic()
        health = client.get("/animegan/healthz")
        converted = convert(client, photo_bytes(), "?size=64")
        sample = client.get("/animegan/styles/test_style/sample.jpg")
        page = client.get("/animegan/")
        assert time.monotonic() - began < 5  # no request waits for the warm-up
    thread.join(60)
    assert health.status_code == 503 and health.json["status"] == "warming"
    assert health.headers["Retry-After"] == "5"
    assert converted.status_code == 503 and converted.headers["Retry-After"] == "5"
    assert "loading its model" in converted.json["error"]
    assert sample.status_code == 503 and page.status_code == 200
    assert not service.warming and service.warmed_up
    assert client.get("/animegan/healthz").json["status"] == "ok"
    assert convert(client, photo_bytes(), "?size=64").status_code == 200
    assert client.get("/animegan/styles/test_style/sample.jpg").status_code == 200


def test_a_warm_up_that_fails_in_the_background_leaves_503s_not_a_hang(openvino_cache,
                                                                      tmp_path):
    app = cold_app(tmp_path, openvino_cache)  # nothing installed
    service = app.extensions["animegan"]
    service.warm_up_in_background().join(60)
    client = app.test_client()
    assert client.get("/animegan/healthz").json["status"] == "no_model"
    assert convert(client, photo_bytes(), "?size=64").status_code in (404, 503)


@pytest.mark.server
def test_a_first_start_answers_503_while_warming_then_converts(models_dir, tmp_path):
    """From the moment the port accepts, every probe answers within 2 s (no request waits in
    the backlog for the warm-up), with 503 "warming" (Retry-After) until the model is
    ready, then 200; conversions meanwhile get a 503 within 2 s, and 200 after."""
    port = free_port()
    env = {**os.environ, "ANIMEGAN_MODELS_DIR": str(models_dir),
           "ANIMEGAN_DEFAULT_STYLE": "test_style", "ANIMEGAN_PRECISION": "fp32",
           "ANIMEGAN_RATE_LIMIT": "", "ANIMEGAN_ACCESS_LOG": "", "ANIMEGAN_MAX_SIDE": "128",
           # a warm-up of some seconds, so that there is a "meanwhile" to look at
           "ANIMEGAN_WARMUP_SIZE": "1024", "ANIMEGAN_SAMPLE_SIZE": "256"}
    log = (tmp_path / "gunicorn.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py",
                               "-b", f"127.0.0.1:{port}", "example_app:app"],
                              cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/animegan"
    probes: list[tuple[int, float, str]] = []
    conversions: list[tuple[int, float]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            began = time.monotonic()
            try:
                health = requests.get(f"{url}/healthz", timeout=10)
            except requests.ConnectionError:  # not bound yet
                time.sleep(0.1)
                continue
            probes.append((health.status_code, time.monotonic() - began,
                           health.headers.get("Retry-After", "")))
            began = time.monotonic()
            answer = requests.post(f"{url}/convert?size=64", data=photo_bytes(), timeout=60,
                                   headers={"Content-Type": "image/jpeg"})
            conversions.append((answer.status_code, time.monotonic() - began))
            if health.status_code == 200 and answer.status_code == 200:
                break
            time.sleep(0.2)
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    output = (tmp_path / "gunicorn.log").read_text(errors="replace")
    print(f"\n{len(probes)} probes, {sum(p[0] == 503 for p in probes)} of them warming, "
          f"slowest after the first {max([t for _, t, _ in probes[1:]] or [0]):.2f} s (the "
          f"first {probes[0][1]:.2f} s); conversions: slowest 503 "
          f"{max([t for c, t in conversions if c == 503] or [0]):.2f} s")
    assert probes and probes[-1][0] == 200, output[-3000:]
    warming = [p for p in probes if p[0] == 503]
    assert warming, "the warm-up was over before the first probe: nothing was looked at"
    assert all(retry == "5" for _, _, retry in warming)
    # the first probe may wait for the app's import (the master binds first); none after it
    assert max(seconds for _, seconds, _ in probes[1:]) <= 2.0, probes
    assert {status for status, _ in conversions} <= {200, 503}
    assert max(seconds for status, seconds in conversions if status == 503) <= 2.0
    assert conversions[-1][0] == 200
    assert "Traceback" not in output
