"""INT8 inference: ANIMEGAN_PRECISION=int8 quantises each style once with NNCF (cached
under ANIMEGAN_MODEL_CACHE_DIR), and a style serves in INT8 only where it passes the
fidelity guard (35 dB at two sizes); one that fails is served in OpenVINO fp32."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import need, photo_bytes
from test_backends import PHOTOS, shipped_engine, sized, start_app

from flask_animegan.runtime.backends.fidelity import MIN_PSNR_DB_INT8, psnr

HAVE_INT8 = all(importlib.util.find_spec(m) is not None for m in ("openvino", "nncf", "skimage"))
NEED_INT8 = "INT8 needs openvino, nncf and scikit-image: pip install -e '.[int8]' scikit-image"


@pytest.mark.slow  # quantises the shipped style (~25 s)
def test_the_shipped_style_serves_in_int8_within_35_db(openvino_cache):
    need(HAVE_INT8, NEED_INT8)
    engine = shipped_engine("openvino", "int8", openvino_cache)
    reference = shipped_engine("torch", "fp32", openvino_cache)
    engine.prepare(0)  # settles int8 (until then the engine runs torch fp32, as with auto)
    assert engine.runner().backend == "openvino" and engine.runner().precision == "int8"
    status = engine.status()
    assert status["styles_backend"] == {"toon_demo": "openvino int8"}
    assert status["fidelity_db"]["toon_demo"] >= MIN_PSNR_DB_INT8
    for size in ("fit-256", "123x77"):  # an odd size too
        for name in PHOTOS:
            image = sized(name, size)
            ours, theirs = (np.asarray(e.run(image)) for e in (engine, reference))
            assert ours.shape == theirs.shape == (image.height, image.width, 3)
            value = psnr(ours, theirs)
            print(f"int8 {name} {image.size}: {value:.1f} dB")
            assert value >= MIN_PSNR_DB_INT8, (name, size, value)


@pytest.mark.slow  # quantises a seeded random style
def test_a_style_whose_int8_fails_the_guard_is_served_in_fp32(make_app, openvino_cache,
                                                               monkeypatch):
    need(HAVE_INT8, NEED_INT8)
    # the seeded random style's INT8 is held to a bar it cannot reach
    monkeypatch.setattr("flask_animegan.runtime.backends.fidelity.MIN_PSNR_DB_INT8", 1000.0)
    app = make_app(ANIMEGAN_MODEL_CACHE_DIR=str(openvino_cache), ANIMEGAN_SHIPPED_STYLES=False,
                   ANIMEGAN_DEFAULT_STYLE="test_style", ANIMEGAN_BACKEND="openvino",
                   ANIMEGAN_PRECISION="int8")
    client = app.test_client()
    health = client.get("/animegan/healthz").json
    assert health["precision"] == "int8"
    assert health["styles_backend"]["test_style"] == "openvino fp32"
    note = health["fidelity_notes"]["test_style"]
    assert "openvino int8 reached only" in note and "openvino fp32 used" in note
    response = client.post("/animegan/convert?style=test_style&size=64",
                           data=photo_bytes("coffee"), content_type="image/jpeg")
    assert response.status_code == 200


@pytest.mark.slow  # two apps in fresh interpreters, the first quantises
def test_the_quantised_model_is_cached_across_a_restart(models_dir, tmp_path):
    need(HAVE_INT8, NEED_INT8)
    settings = ("ANIMEGAN_BACKEND=openvino", "ANIMEGAN_PRECISION=int8")
    first, log = start_app(models_dir, tmp_path, *settings)
    load = first["openvino"]["loads"]["test_style int8"]
    assert load["quantized"] and not load["compiled_from_cache"], load
    assert "converted and quantised in" in log
    assert any(p.name.endswith(".xml") and "-int8-" in p.name for p in tmp_path.rglob("*"))
    second, log = start_app(models_dir, tmp_path, *settings)
    load = second["openvino"]["loads"]["test_style int8"]
    assert not load["quantized"] and load["compiled_from_cache"], load
    assert "converted and quantised model read from the cache" in log
    # whichever way the guard went, it went the same way both times, and says so
    assert first["styles_backend"] == second["styles_backend"]
    assert second["styles_backend"]["test_style"] in ("openvino int8", "openvino fp32")
    print(f"\ncold: {first['openvino']['loads']}\nwarm: {second['openvino']['loads']}")
