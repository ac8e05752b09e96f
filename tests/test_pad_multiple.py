"""ANIMEGAN_PAD_MULTIPLE: pictures reflect-padded to a multiple before the network and
cropped back, for CPUs whose kernels are slow on odd sizes (``python -m bench.odd_sizes``
tells whether a CPU's kernels want it)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import convert, open_image, photo_bytes

from flask_animegan import get_service
from flask_animegan.config import Settings
from flask_animegan.runtime.backends.base import to_pixels
from flask_animegan.runtime.backends.fidelity import psnr
from flask_animegan.runtime.backends.torch import TorchRunner
from flask_animegan.runtime.engine import InferenceEngine
from flask_animegan.runtime.styles import SHIPPED_STYLES_DIR
from flask_animegan.runtime.weights import load_generator

SHIPPED = SHIPPED_STYLES_DIR / "toon_demo.pt"


class Seen:
    """A real runner that notes the shapes it was given."""

    def __init__(self) -> None:
        self.runner = TorchRunner(load_generator(SHIPPED), "fp32")
        self.backend, self.precision = self.runner.backend, self.runner.precision
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        self.shapes.append(pixels.shape)
        return self.runner(pixels)


def engine(multiple: int) -> InferenceEngine:
    return InferenceEngine.from_settings(
        SHIPPED.parent, Settings(default_style="toon_demo", backend="torch", precision="fp32",
                                 pad_multiple=multiple, model_cache_dir=""))


@pytest.mark.parametrize("multiple, shape, padded", [
    (8, (341, 512), (344, 512)),
    (16, (171, 256), (176, 256)),
    (32, (512, 341), (512, 352)),
    (8, (5, 7), (16, 16)),  # under MIN_SIDE: edge-padded to 16 first, already a multiple
    (32, (5, 7), (32, 32)),
    (4, (128, 128), (128, 128)),  # a multiple already: as is
])
def test_the_network_sees_the_padded_shape_and_the_result_is_cropped_back(multiple, shape,
                                                                          padded):
    pixels = np.random.default_rng(0).integers(0, 256, (*shape, 3), dtype=np.uint8)
    seen = Seen()
    out = engine(multiple).forward(seen, pixels)
    assert seen.shapes == [(*padded, 3)]
    assert out.shape == (*shape, 3) and np.isfinite(out).all()


@pytest.mark.parametrize("multiple", [8, 16])
def test_padding_a_side_that_is_a_multiple_of_4_keeps_the_picture(multiple):
    """300 x 200 padded to 304 x 200 (8) or 304 x 208 (16): the network's geometry is the
    same, only GroupNorm's statistics take the reflected rows in; close to the unpadded
    result (48 and 41 dB), never equal; the more rows, the further (320 x 224: 37 dB).
    (A side that is no multiple of 4 changes the geometry of the network's upsampling:
    23-33 dB, docs/benchmark.md.)"""
    photo = np.array(open_image(photo_bytes("coffee")).resize((300, 200)))
    plain = to_pixels(engine(1).forward(Seen(), photo))
    padded = to_pixels(engine(multiple).forward(Seen(), photo))
    assert plain is not None and padded is not None
    assert 40 <= psnr(plain, padded) < 90


def test_the_setting_reaches_the_served_picture(make_app):
    app = make_app(ANIMEGAN_PAD_MULTIPLE=32)
    with app.app_context():
        assert get_service().engine.pad_multiple == 32
    response = convert(app.test_client(), photo_bytes("coffee"), "?size=100")
    assert response.status_code == 200, response.get_data()[:300]
    # 100 x 67: no multiple of 32, answered at exactly that size
    assert open_image(response.data).size == (100, 67)
