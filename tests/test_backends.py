"""Backends: every backend and precision this CPU runs stays within 40 dB PSNR of torch
fp32 on real photos; ``auto`` falls back to torch without the openvino extra; the choice
shows in /healthz and the startup log; OpenVINO's model cache survives a restart."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, need, photo, photo_bytes
from PIL import Image

from flask_animegan.config import Settings
from flask_animegan.inputs import decoding
from flask_animegan.runtime.backends.fidelity import min_db, psnr
from flask_animegan.runtime.engine import InferenceEngine
from flask_animegan.runtime.precision import native_bf16
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR

HAVE_OPENVINO = importlib.util.find_spec("openvino") is not None
NEED_OPENVINO = "the openvino extra is not installed: pip install -e '.[openvino]'"
PHOTOS = ("astronaut", "coffee", "chelsea")
#: a fitted photo at the usual size, and an odd one (neither side even)
SIZES = ("fit-256", "123x77")


def openvino_precisions() -> tuple[str, ...]:
    if not HAVE_OPENVINO:
        return ("fp32",)  # listed so that the test says it skipped (fails in CI)
    from flask_animegan.runtime.backends.openvino import OpenVINOBackend

    return OpenVINOBackend(cache_dir=None, threads=1).precisions()


CANDIDATES = ([("torch", "bf16")] if native_bf16() else []) + [
    ("openvino", precision) for precision in openvino_precisions()]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def shipped_engine(backend: str, precision: str, cache: Path) -> InferenceEngine:
    return InferenceEngine.from_settings(SHIPPED_STYLES_DIR, Settings(
        default_style="toon_demo", backend=backend, precision=precision,
        model_cache_dir=str(cache)))


def sized(name: str, size: str) -> Image.Image:
    image = photo(name)
    if size.startswith("fit-"):
        return decoding.fit(image, int(size[4:]))
    width, height = (int(n) for n in size.split("x"))
    return image.resize((width, height), Image.Resampling.LANCZOS)


@pytest.mark.slow  # converts and compiles each candidate, ~20 s each
@pytest.mark.parametrize("backend, precision", CANDIDATES,
                         ids=[f"{b}-{p}" for b, p in CANDIDATES])
def test_each_backend_and_precision_stays_within_40_db_of_torch_fp32(backend, precision,
                                                                      model_cache):
    if backend == "openvino":
        need(HAVE_OPENVINO, NEED_OPENVINO)
    reference = shipped_engine("torch", "fp32", model_cache)
    engine = shipped_engine(backend, precision, model_cache)
    engine.prepare(0)  # int8, like auto, is settled there
    # the guard let it serve the trained style (it would fall back to torch fp32)
    assert engine.runner().backend == backend and engine.runner().precision == precision
    assert engine.status()["styles_backend"] == {"toon_demo": f"{backend} {precision}"}
    for size in SIZES:
        for name in PHOTOS:
            image = sized(name, size)
            ours, theirs = (np.asarray(e.run(image)) for e in (engine, reference))
            assert ours.shape == theirs.shape == (image.height, image.width, 3)
            value = psnr(ours, theirs)
            print(f"{backend} {precision} {name} {image.size}: {value:.1f} dB")
            assert value >= (35 if precision == "int8" else 40), (name, size, value)


@pytest.mark.slow  # compiles OpenVINO models
def test_openvino_threads_follow_torch_and_shapes_never_recompile(model_cache):
    need(HAVE_OPENVINO, NEED_OPENVINO)
    engine = shipped_engine("openvino", "fp32", model_cache)
    runner = engine.runner()
    assert runner.compiled.get_property("INFERENCE_NUM_THREADS") == torch.get_num_threads()
    # dynamic height and width: one compiled model serves every shape
    for height, width in ((77, 123), (128, 96), (15, 9), (77, 123)):
        out = engine.forward(runner, np.zeros((height, width, 3), np.uint8))
        assert out.shape == (height, width, 3)
    assert engine.runner() is runner and runner.compiled is engine.runner().compiled


@pytest.mark.slow  # times every backend and precision at warm-up
def test_auto_picks_the_fastest_candidate_and_says_so(make_app, model_cache, caplog):
    need(HAVE_OPENVINO, NEED_OPENVINO)
    with caplog.at_level(logging.INFO, logger="flask_animegan"):
        app = make_app(ANIMEGAN_MODEL_CACHE_DIR=str(model_cache), ANIMEGAN_SHIPPED_STYLES=False,
                       ANIMEGAN_DEFAULT_STYLE="test_style", ANIMEGAN_BACKEND="auto",
                       ANIMEGAN_PRECISION="auto")
    health = app.test_client().get("/animegan/healthz").json
    timings = health["backend_timings"]
    assert {"torch fp32", "openvino fp32"} <= set(timings)
    chosen = f"{health['backend']} {health['precision']}"
    assert chosen == min(timings, key=timings.get)
    assert health["styles_backend"]["test_style"] == chosen
    assert health["backend_requested"] == "auto" and health["backends_missing"] == {}
    line = next(r.getMessage() for r in caplog.records if "warmed up" in r.getMessage())
    assert f"loaded ({chosen}; auto timed torch fp32 " in line and "openvino fp32" in line

    # a style loaded later runs on the same choice, checked by the guard too
    client = app.test_client()
    response = client.post("/animegan/convert?style=other_style&size=64",
                           data=photo_bytes("coffee"), content_type="image/jpeg")
    assert response.status_code == 200
    health = client.get("/animegan/healthz").json
    assert health["styles_backend"]["other_style"] == chosen
    if chosen != "torch fp32":
        assert health["fidelity_db"]["other_style"] >= min_db(health["precision"])


@pytest.mark.slow  # compiles OpenVINO models
def test_a_candidate_below_the_guard_is_refused_and_shown(make_app, model_cache, monkeypatch):
    need(HAVE_OPENVINO, NEED_OPENVINO)
    # nothing reaches it
    monkeypatch.setattr("flask_animegan.runtime.backends.fidelity.MIN_PSNR_DB", 1000.0)
    app = make_app(ANIMEGAN_MODEL_CACHE_DIR=str(model_cache), ANIMEGAN_SHIPPED_STYLES=False,
                   ANIMEGAN_DEFAULT_STYLE="test_style", ANIMEGAN_BACKEND="openvino",
                   ANIMEGAN_PRECISION="fp32")
    health = app.test_client().get("/animegan/healthz").json
    assert health["styles_backend"]["test_style"] == "torch fp32"
    assert "openvino fp32 reached only" in health["fidelity_notes"]["test_style"]


#: Builds an app in a fresh interpreter, warms it up and prints its /healthz; argv:
#: models folder, model cache folder, then KEY=VALUE settings. ``openvino`` is made
#: unimportable first when the environment says so (a real failed import, as without
#: the extra).
APP_SCRIPT = """
import json, logging, os, sys
if os.environ.get("HIDE_OPENVINO"):
    sys.modules["openvino"] = None
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from flask import Flask
from flask_animegan import AnimeGAN
app = Flask("host_app")
app.config.update(ANIMEGAN_MODELS_DIR=sys.argv[1], ANIMEGAN_MODEL_CACHE_DIR=sys.argv[2],
                  ANIMEGAN_SHIPPED_STYLES=False, ANIMEGAN_DEFAULT_STYLE="test_style",
                  ANIMEGAN_WARMUP_SIZE=32,
                  ANIMEGAN_SAMPLE_SIZE=0, ANIMEGAN_RATE_LIMIT="", ANIMEGAN_CSRF=False)
app.config.update(dict(arg.split("=", 1) for arg in sys.argv[3:]))
AnimeGAN(app)
AnimeGAN.warm_up(app)
print(json.dumps(app.test_client().get("/animegan/healthz").json))
"""


def start_app(models_dir: Path, cache: Path, *settings: str,
              hide_openvino: bool = False) -> tuple[dict, str]:
    env = {"HIDE_OPENVINO": "1"} if hide_openvino else {}
    done = subprocess.run([sys.executable, "-c", APP_SCRIPT, str(models_dir), str(cache),
                           *settings], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**{k: v for k, v in os.environ.items()
                                  if not k.startswith("ANIMEGAN_")}, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow  # an app in a fresh interpreter each
@pytest.mark.parametrize("requested", ["auto", "openvino"])
def test_without_the_openvino_extra_the_app_runs_on_torch(models_dir, tmp_path, requested):
    # fp32: on a CPU with native bf16, `auto` precision may pick torch bf16, which is not
    # what this test is about
    health, log = start_app(models_dir, tmp_path, f"ANIMEGAN_BACKEND={requested}",
                            "ANIMEGAN_PRECISION=fp32", hide_openvino=True)
    assert health["status"] == "ok"
    assert health["backend"] == "torch" and health["backends_available"] == ["torch"]
    assert "flask-animegan[openvino]" in health["backends_missing"]["openvino"]
    assert health["styles_backend"] == {"test_style": "torch fp32"}
    assert "loaded (torch fp32" in log and "Traceback" not in log
    if requested == "openvino":
        assert "ANIMEGAN_BACKEND=openvino, but openvino cannot be imported" in log
    assert list(tmp_path.iterdir()) == []  # nothing cached without openvino


@pytest.mark.slow  # two apps in fresh interpreters
def test_the_openvino_cache_survives_a_restart(models_dir, tmp_path):
    need(HAVE_OPENVINO, NEED_OPENVINO)
    settings = ("ANIMEGAN_BACKEND=openvino", "ANIMEGAN_PRECISION=fp32")
    first, _ = start_app(models_dir, tmp_path, *settings)
    files = _listing(tmp_path)
    assert any(name.endswith(".xml") for name in files)  # the converted model
    assert any("/compiled/" in name and name.endswith(".blob") for name in files)
    load = first["openvino"]["loads"]["test_style fp32"]
    assert load["converted"] and not load["compiled_from_cache"]

    second, log = start_app(models_dir, tmp_path, *settings)
    load = second["openvino"]["loads"]["test_style fp32"]
    # the second start converts and compiles nothing: the cache gains no file
    assert not load["converted"] and load["compiled_from_cache"], load
    assert _listing(tmp_path) == files
    assert second["styles_backend"] == {"test_style": "openvino fp32"}
    assert "compiled blob loaded from the cache" in log
    print(f"\ncold: {first['openvino']['loads']}\nwarm: {second['openvino']['loads']}")


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (lock files aside) as ``/relative/path``: (size, mtime)."""
    return {f"/{p.relative_to(folder)}": (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file() and p.suffix != ".lock"}


def test_openvino_buffers_go_back_once_idle(model_cache, monkeypatch):
    need(HAVE_OPENVINO, NEED_OPENVINO)
    monkeypatch.setattr("flask_animegan.runtime.engine.IDLE_RELEASE_S", 0.3)
    engine = shipped_engine("openvino", "fp32", model_cache)
    runner = engine.runner()
    released = []
    monkeypatch.setattr(runner, "release_memory", lambda: released.append(True))
    picture = sized("chelsea", "123x77")
    for _ in range(3):  # back to back: the buffers stay
        engine.run(picture)
    assert released == []
    time.sleep(1.0)
    assert released == [True]  # once, after the last one


@pytest.mark.slow  # compiles, then converts in two apps at once
def test_two_apps_share_a_compiled_style_and_release_while_the_other_converts(model_cache):
    """Engines of one process share a style's compiled model, each behind its own gate:
    one giving its buffers back while the other converts must not fail either."""
    need(HAVE_OPENVINO, NEED_OPENVINO)
    first, second = (shipped_engine("openvino", "fp32", model_cache) for _ in range(2))
    first.prepare(0)
    second.prepare(0)
    assert first.runner().compiled is second.runner().compiled  # type: ignore[attr-defined]
    picture = sized("astronaut", "fit-512")
    done = threading.Event()
    failures: list[BaseException] = []

    def convert() -> None:
        try:
            for _ in range(3):
                first.run(picture)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=convert)
    worker.start()
    releases = 0
    while not done.is_set():
        second.runner().release_memory()  # type: ignore[attr-defined]
        releases += 1
    worker.join()
    assert not failures and releases > 10
