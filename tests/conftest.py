"""Shared fixtures: seeded test weights, an app factory, real photos from scikit-image."""

from __future__ import annotations

import io
import os
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import skimage.data
import torch
from flask import Flask
from PIL import Image

from flask_animegan import AnimeGAN, Generator

REPO = Path(__file__).resolve().parent.parent
IN_CI = bool(os.environ.get("CI"))


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


@pytest.fixture
def make_app(models_dir: Path, openvino_cache: Path) -> Callable[..., Flask]:
    """Build a fresh Flask app with AnimeGAN, warmed up as under gunicorn; keyword
    arguments become config."""

    def factory(**config: object) -> Flask:
        app = Flask("host_app")
        app.config.update({
            "TESTING": True,
            "ANIMEGAN_MODELS_DIR": str(models_dir),
            "ANIMEGAN_WARMUP_SIZE": 32,
            "ANIMEGAN_RATE_LIMIT": "",  # the rate-limit tests turn it on
            "ANIMEGAN_MAX_SIDE": 128,  # small images keep the suite fast
            # only the test styles (each warm-up would load and sample toon_demo too);
            # the shipped style's own tests turn it back on
            "ANIMEGAN_SHIPPED_STYLES": False,
            # torch: timing every backend at each app's warm-up would cost the suite
            # minutes; tests/test_backends.py and the real-gunicorn tests run `auto`
            "ANIMEGAN_BACKEND": "torch",
            "ANIMEGAN_MODEL_CACHE_DIR": str(openvino_cache),
        })
        app.config.update(config)
        AnimeGAN(app)
        AnimeGAN.warm_up(app)  # as gunicorn.conf.py does in each worker
        return app

    return factory


@pytest.fixture
def app(make_app: Callable[..., Flask]) -> Flask:
    return make_app()


@pytest.fixture
def client(app: Flask):
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def need(condition: bool, reason: str) -> None:
    """Skip when a tool is missing locally; in CI (CI set) a missing tool is a failure."""
    if not condition:
        if IN_CI:
            pytest.fail(f"{reason} (required in CI)")
        pytest.skip(reason)


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server on a free loopback port (config in a temp folder), flushed for each test."""
    from redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()
