"""The pool of loaded styles: a load in progress (seconds, under its own lock) never
makes the readers of the table (``/healthz``, ``GET /styles``) wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import torch

from flask_animegan.runtime.catalog import StyleInfo
from flask_animegan.runtime.models import LoadedStyle, ModelPool


def test_readers_do_not_wait_for_a_load_in_progress(tmp_path: Path):
    started, release = threading.Event(), threading.Event()

    def slow_loader(style: StyleInfo) -> LoadedStyle:
        started.set()
        release.wait(30)
        return LoadedStyle(torch.nn.Identity(), runner=lambda image: image)

    pool = ModelPool(max_loaded=2, pinned="a", loader=slow_loader)
    other = StyleInfo("b", "MIT", "other", path=tmp_path / "b.pt")
    loading = threading.Thread(target=pool.get, args=(other,))
    loading.start()
    try:
        assert started.wait(10)
        began = time.monotonic()
        assert pool.loaded_styles() == {} and pool.loaded == [] and pool.broken() == {}
        assert time.monotonic() - began < 1.0  # microseconds; the load holds for 30 s
    finally:
        release.set()
        loading.join(30)
    assert list(pool.loaded_styles()) == ["b"] and pool.loaded == ["b"]


def test_the_healthz_of_a_real_app_answers_while_a_style_loads(make_app):
    app = make_app()
    pool = app.extensions["animegan"].engine.pool
    answers: list = []
    probe = threading.Thread(
        target=lambda: answers.append(app.test_client().get("/animegan/healthz")))
    with pool._loading:  # what a load of another style holds, for seconds
        probe.start()
        probe.join(10)  # before: it waited for the load to end (here: forever)
        assert answers, "/healthz waited for a style load"
    assert answers[0].status_code == 200 and "loaded" in answers[0].json
