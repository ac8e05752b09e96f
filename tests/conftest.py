"""Shared fixtures: seeded test weights, an app factory and one shared app, real photos
from scikit-image, and the markers that keep a bare ``pytest`` fast."""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skimage.data
import torch
from flask import Flask
from flask.testing import FlaskClient
from PIL import Image

from bench.servers import free_port
from flask_animegan import AnimeGAN, Generator

REPO = Path(__file__).resolve().parent.parent
IN_CI = bool(os.environ.get("CI"))

__all__ = ["free_port"]  # tests import it from here

#: Fixtures that start a real server, and the marker a test that uses one gets (a bare
#: ``pytest`` deselects these markers; setup.cfg).
SERVER_FIXTURES = {"redis_server": "redis", "killable_redis": "redis"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that use a server fixture, directly or through a parameter named
    after the server (``uri`` = "redis" in tests/test_storage.py)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            names |= {f"{value}_server" for value in callspec.params.values()
                      if isinstance(value, str)}
        for fixture, marker in SERVER_FIXTURES.items():
            if fixture in names:
                item.add_marker(marker)


def save_random_generator(path: Path, seed: int) -> Path:
    """A seeded, randomly initialised generator saved as a plain state dict."""
    torch.manual_seed(seed)
    torch.save(Generator().state_dict(), path)
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A models folder with two styles: ``test_style`` (seed 0) and ``other_style`` (seed 1)."""
    folder = tmp_path_factory.mktemp("models")
    save_random_generator(folder / "test_style.pt", seed=0)
    save_random_generator(folder / "other_style.pt", seed=1)
    return folder


@pytest.fixture(scope="session")
def openvino_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where test apps keep OpenVINO's converted models (never the user's ~/.cache)."""
    return tmp_path_factory.mktemp("model-cache")


#: The config every test app starts from; keyword arguments of ``make_app`` change it.
TEST_CONFIG: dict[str, Any] = {
    "TESTING": True,
    "ANIMEGAN_WARMUP_SIZE": 32,
    "ANIMEGAN_RATE_LIMIT": "",  # the rate-limit tests turn it on
    "ANIMEGAN_MAX_SIDE": 128,  # small images keep the suite fast
    # only the test styles (each warm-up would load and sample toon_demo too);
    # the shipped style's own tests turn it back on
    "ANIMEGAN_SHIPPED_STYLES": False,
    # timing backends and precisions at each app's warm-up would cost the suite minutes
    # (bf16 alone ~10 s on 2 cores); tests/test_backends.py, test_shipped_style.py and the
    # real-gunicorn tests run `auto`
    "ANIMEGAN_BACKEND": "torch",
    "ANIMEGAN_PRECISION": "fp32",
    # the style picker's samples are a conversion per style at warm-up; tests/test_page.py
    # turns them on
    "ANIMEGAN_SAMPLE_SIZE": 0,
    # the form's own CSRF token needs a SECRET_KEY (without one the app refuses to start);
    # build_app turns it on for the tests that give a key
    "ANIMEGAN_CSRF": False,
}


def build_app(models_dir: Path, openvino_cache: Path, **config: object) -> Flask:
    """A Flask app with AnimeGAN on the test config plus ``config``, warmed up as under
    gunicorn."""
    app = Flask("host_app")
    app.config.update(TEST_CONFIG, ANIMEGAN_MODELS_DIR=str(models_dir),
                      ANIMEGAN_MODEL_CACHE_DIR=str(openvino_cache))
    app.config.update(config)
    if "SECRET_KEY" in config and "ANIMEGAN_CSRF" not in config:
        app.config["ANIMEGAN_CSRF"] = True  # with a key, the form has its token (the default)
    AnimeGAN(app)
    AnimeGAN.warm_up(app)  # as gunicorn.conf.py does in each worker
    return app


@pytest.fixture
def make_app(models_dir: Path, openvino_cache: Path) -> Callable[..., Flask]:
    """Build a fresh app of your own; keyword arguments become config. For tests that
    change config or state (limits, queue, metrics, styles); the others use ``app``."""

    def factory(**config: object) -> Flask:
        return build_app(models_dir, openvino_cache, **config)

    return factory


class OwnAddressClient(FlaskClient):
    """A test client with a loopback address of its own (127.0.x.y), so that what the
    shared app keeps per client (cached results, rate-limit counts) never passes from
    one test to the next. An ``environ_base`` given to a request still wins."""

    _addresses = itertools.count(1)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        number = next(self._addresses)
        self.environ_base["REMOTE_ADDR"] = f"127.0.{number // 250 % 250}.{number % 250 + 1}"


@pytest.fixture(scope="session")
def app(models_dir: Path, openvino_cache: Path) -> Flask:
    """One app on the test config, built once and shared by every test that asks for it
    (a build loads and warms up a style). Read-only: a test that changes its config or
    its service's state uses ``make_app`` instead. Each ``app.test_client()`` is a client
    of its own (``OwnAddressClient``)."""
    shared = build_app(models_dir, openvino_cache)
    shared.test_client_class = OwnAddressClient
    return shared


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A client of the shared ``app``, with an address of its own."""
    return app.test_client()


#: Distinct photographs inside scikit-image's wheel (``cat`` is ``chelsea``, so only one).
COLOR_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                "immunohistochemistry", "retina", "stereo_motorcycle")
GRAY_PHOTOS = ("camera", "coins", "moon", "clock", "grass", "gravel", "brick", "cell", "page",
               "text")
PHOTOS = COLOR_PHOTOS + GRAY_PHOTOS


def photo(name: str = "chelsea") -> Image.Image:
    """A real photograph shipped inside scikit-image's wheel, as an RGB image."""
    array = getattr(skimage.data, name)()
    if isinstance(array, tuple):
        array = array[0]
    image = Image.fromarray(np.asarray(array))
    return image.convert("RGB")


def convert(client, data: bytes, query: str = "", **kwargs):
    """POST ``data`` to the API as a JPEG body (``query``: e.g. ``"?size=64"``)."""
    return client.post(f"/animegan/convert{query}", data=data, content_type="image/jpeg",
                       **kwargs)


def encode_image(image: Image.Image, fmt: str = "JPEG", **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def photo_bytes(name: str = "chelsea", fmt: str = "JPEG", **params: object) -> bytes:
    return encode_image(photo(name), fmt, **params)


def pixelated(image: Image.Image, box: tuple[int, int, int, int], block: int) -> Image.Image:
    """``image`` with the region ``box`` pixelated in blocks of ``block`` pixels (a local edit)."""
    copy = image.copy()
    part = copy.crop(box)
    small = part.resize((part.width // block, part.height // block), Image.Resampling.BOX)
    copy.paste(small.resize(part.size, Image.Resampling.NEAREST), box[:2])
    return copy


def open_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def need(condition: bool, reason: str) -> None:
    """Skip when a tool is missing locally; in CI (CI set) a missing tool is a failure."""
    if not condition:
        if IN_CI:
            pytest.fail(f"{reason} (required in CI)")
        pytest.skip(reason)


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server on a free loopback port (config in a temp folder), flushed for each test."""
    from servers import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()
