"""Styles as the service sees them: the default fixed at start, names matched in full,
broken weights refused, a network that outputs NaN never returned or cached."""

from __future__ import annotations

import logging

import torch
from conftest import convert, photo_bytes, save_random_generator

from flask_animegan.runtime.generator import Generator


# -- JPEG scans ---------------------------------------------------------------------------
# -- styles ---------------------------------------------------------------------------------
def test_the_default_style_is_fixed_at_startup_and_each_model_keeps_its_name(make_app, tmp_path):
    save_random_generator(tmp_path / "toon_demo.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path))
    client = app.test_client()
    data = photo_bytes("astronaut")
    before = convert(client, data, "?size=64")
    assert before.headers["X-AnimeGAN-Style"] == "toon_demo"
    # `flask animegan pull paprika` writes a file that is a preferred default
    save_random_generator(tmp_path / "paprika.pt", seed=1)
    default = convert(client, data, "?size=64")
    paprika = convert(client, data, "?size=64&style=paprika")
    assert default.headers["X-AnimeGAN-Style"] == "toon_demo"
    assert default.data == before.data
    assert paprika.headers["X-AnimeGAN-Style"] == "paprika"
    assert paprika.data != default.data  # its own weights, not the default's
    health = client.get("/animegan/healthz").json
    assert health["default_style"] == "toon_demo" and health["loaded"][0] == "toon_demo"
    service = app.extensions["animegan"]
    assert service.model is service.engine.model(None)  # runtime state, not in app.config
    assert "ANIMEGAN_MODEL" not in app.config


def test_style_names_must_match_in_full(make_app, tmp_path, caplog):
    save_random_generator(tmp_path / "good.pt", seed=0)
    save_random_generator(tmp_path / "nl\n.pt", seed=1)
    save_random_generator(tmp_path / "Upper.pt", seed=1)
    with caplog.at_level(logging.WARNING, logger="flask_animegan"):
        app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_SHIPPED_STYLES=False)
    assert "'nl\\n.pt'" in caplog.text or "nl\n.pt" in caplog.text
    client = app.test_client()
    assert [s["name"] for s in client.get("/animegan/styles").json["styles"]
            if s["installed"]] == ["good"]
    for name in ("nl%0A", "nl\n", "good%0A"):
        response = convert(client, photo_bytes(), f"?style={name}")
        assert response.status_code == 404, name
    listing = app.test_cli_runner().invoke(args=["animegan", "styles"]).output
    assert "SKIPPED" in listing and "Upper.pt" in listing


def test_weights_full_of_nan_are_refused_at_load(make_app, tmp_path):
    save_random_generator(tmp_path / "good.pt", seed=0)
    state = Generator().state_dict()
    state = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
             for k, v in state.items()}
    torch.save(state, tmp_path / "nan.pt")
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good")
    client = app.test_client()
    for _ in range(2):  # and it is not cached
        response = convert(client, photo_bytes(), "?style=nan")
        assert response.status_code == 503 and "'nan'" in response.json["error"]
    assert app.extensions["animegan"].cache.stats()["entries"] == 0


def test_a_network_that_outputs_nan_is_never_returned_or_cached(make_app, tmp_path):
    # finite weights whose output overflows: a huge final convolution
    torch.manual_seed(0)
    model = Generator()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1e30)
    torch.save(model.state_dict(), tmp_path / "overflow.pt")
    save_random_generator(tmp_path / "good.pt", seed=0)
    app = make_app(ANIMEGAN_MODELS_DIR=str(tmp_path), ANIMEGAN_DEFAULT_STYLE="good",
                   ANIMEGAN_PRECISION="fp32")
    client = app.test_client()
    response = convert(client, photo_bytes(), "?style=overflow")
    assert response.status_code == 503
    assert app.extensions["animegan"].cache.stats()["entries"] == 0
    assert client.get("/animegan/healthz").json["status"] == "degraded"
