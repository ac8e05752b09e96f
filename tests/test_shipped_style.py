"""The shipped ``toon_demo`` style: package data served besides the models folder, loads, is
the offline default, converts end to end, and bf16 inference stays within 40 dB PSNR of fp32
on real photos with trained weights. Its model card's figures: tests/test_toon_demo.py."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import requests
import torch
from conftest import open_image, photo, photo_bytes, save_random_generator
from PIL import Image
from servers import Server

from flask_animegan import load_generator
from flask_animegan.config import Settings
from flask_animegan.inputs import decoding
from flask_animegan.runtime.engine import InferenceEngine
from flask_animegan.runtime.precision import native_bf16
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR

SHIPPED = SHIPPED_STYLES_DIR / "toon_demo.pt"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def test_the_shipped_file_is_a_half_precision_state_dict_that_loads_strictly():
    state = torch.load(SHIPPED, weights_only=True)
    assert all(v.dtype == torch.float16 for v in state.values())
    assert SHIPPED.stat().st_size < 5_000_000  # fp16: about half of the 8.6 MB fp32 file
    model = load_generator(SHIPPED)
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.slow  # the shipped style at 512 px in two precisions, per photo
@pytest.mark.skipif(not native_bf16(), reason="this CPU has no native bf16")
@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea", "rocket"])
def test_bf16_stays_within_40_db_of_fp32_on_real_photos(name):
    image = decoding.fit(photo(name), 512)
    outputs = {}
    for precision in ("fp32", "bf16"):
        engine = InferenceEngine.from_settings(
            SHIPPED.parent, Settings(default_style="toon_demo", precision=precision))
        outputs[precision] = np.asarray(engine.run(image))
    value = psnr(outputs["fp32"], outputs["bf16"])
    print(f"\n{name}: bf16 vs fp32 PSNR {value:.1f} dB")
    assert value >= 40


@pytest.mark.server
def test_a_fresh_clone_serves_the_shipped_style_by_default(tmp_path):
    """The README's serve command with no configuration: toon_demo converts a real photo."""
    server = Server({"ANIMEGAN_ACCESS_LOG": ""}, log=tmp_path / "gunicorn.log")
    try:
        health = requests.get(f"{server.url}/animegan/healthz", timeout=10).json()
        assert health["default_style"] == "toon_demo" and health["status"] == "ok"
        styles = requests.get(f"{server.url}/animegan/styles", timeout=10).json()["styles"]
        shipped = next(s for s in styles if s["name"] == "toon_demo")
        assert shipped["licence"] == "MIT" and "this project" in shipped["licence_note"]
        assert "not an official AnimeGANv2 style" in shipped["description"]
        session = requests.Session()
        form = session.get(f"{server.url}/animegan/", timeout=10).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', form).group(1)
        page = session.post(f"{server.url}/animegan/upload", timeout=120,
                            files={"image": ("me.jpg", photo_bytes("astronaut"))},
                            data={"csrf_token": token})
        assert page.status_code == 200
        anime_url = re.search(r'id="animegan-result"[^>]* src="([^"]+)"', page.text).group(1)
        result = open_image(session.get(server.url + anime_url, timeout=10).content)
        source = photo("astronaut")
        assert result.size == source.size == (512, 512)
        # stylised: clearly different from the photo, yet the same picture
        difference = psnr(np.asarray(result.convert("RGB")), np.asarray(source))
        assert 10 < difference < 30, difference
        small = [np.asarray(im.convert("L").resize((32, 32), Image.Resampling.BOX), float)
                 for im in (result, source)]
        assert np.corrcoef(small[0].ravel(), small[1].ravel())[0, 1] > 0.8
    finally:
        server.stop()


def test_auto_precision_times_both_and_keeps_the_faster():
    # torch's own precisions (under backend auto, OpenVINO's are candidates too: test_backends)
    engine = InferenceEngine.from_settings(
        SHIPPED.parent, Settings(default_style="toon_demo", backend="torch", precision="auto"))
    assert engine.precision == "fp32"  # until measured
    engine.prepare(64)
    chosen = engine.precision
    if native_bf16():
        timings = engine.precision_timings
        assert set(timings) == {"fp32", "bf16"} and chosen == min(timings, key=timings.get)
    else:
        assert chosen == "fp32" and engine.precision_timings == {}
    assert next(engine.model().parameters()).dtype == engine.dtype
    assert engine.status()["precision"] == chosen


# -- served from the package, besides the models folder ----------------------------------
def styles_by_name(client) -> dict:
    return {s["name"]: s for s in client.get("/animegan/styles").json["styles"]}


def convert(client, query: str = ""):
    return client.post(f"/animegan/convert?size=64{query}",
                       data={"image": (io.BytesIO(photo_bytes("astronaut")), "me.jpg")})


def test_the_shipped_style_is_served_besides_the_models_folder_and_after_it(make_app):
    app = make_app(ANIMEGAN_SHIPPED_STYLES=True)
    client = app.test_client()
    styles = styles_by_name(client)
    assert styles["toon_demo"]["installed"] and not styles["toon_demo"]["default"]
    assert styles["other_style"]["default"]  # a style someone installed beats the demo
    assert app.extensions["animegan"].engine.styles["toon_demo"].path == SHIPPED
    response = convert(client, "&style=toon_demo")
    assert response.status_code == 200 and response.headers["X-AnimeGAN-Style"] == "toon_demo"


def test_with_an_empty_models_folder_the_shipped_style_is_the_default(make_app, tmp_path):
    client = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path / "none-yet"),
                      ANIMEGAN_SHIPPED_STYLES=True).test_client()
    assert [name for name, s in styles_by_name(client).items() if s["installed"]] == ["toon_demo"]
    response = convert(client)
    assert response.status_code == 200 and response.headers["X-AnimeGAN-Style"] == "toon_demo"


def test_a_file_of_the_same_name_in_the_models_folder_replaces_the_shipped_style(make_app,
                                                                                 tmp_path):
    own = save_random_generator(tmp_path / "toon_demo.pt", seed=3)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_SHIPPED_STYLES=True)
    assert app.extensions["animegan"].engine.styles["toon_demo"].path == own


def test_the_shipped_styles_can_be_turned_off(make_app, tmp_path):
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_SHIPPED_STYLES=False)
    assert app.extensions["animegan"].engine.styles == {}
    assert convert(app.test_client()).status_code == 503
