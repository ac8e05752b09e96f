"""INT8 for the OpenVINO backend: NNCF's post-training quantisation with the recipe that
``python -m bench.int8`` chose (docs/benchmark.md); the fidelity guard still judges it."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import numpy as np

#: Bump when the recipe below changes: it is part of the quantised model's cache key.
RECIPE_VERSION = "1"
CALIBRATION = ("rocket", "stereo_motorcycle", "hubble_deep_field",
               "immunohistochemistry", "retina", "camera", "coins", "grass", "brick")
CALIBRATION_SIDE = 384
INSTALL_HINT = "pip install 'flask-animegan[int8]' scikit-image"


def missing() -> str | None:
    """Why INT8 is not available here (None when it is): nncf and scikit-image's photos."""
    for module, package in (("nncf", "nncf"), ("skimage", "scikit-image")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed; {INSTALL_HINT}"
    return None


def version() -> str:
    """NNCF's version (part of the cache key); imports nothing heavy."""
    from importlib.metadata import version as installed

    return installed("nncf")


def calibration_photos(side: int = CALIBRATION_SIDE) -> list[np.ndarray]:
    """The calibration photos as uint8 RGB (H, W, 3), fitted to ``side`` px."""
    import skimage.data
    from PIL import Image

    photos = []
    for name in CALIBRATION:
        array = getattr(skimage.data, name)()
        array = np.asarray(array[0] if isinstance(array, tuple) else array)
        image = Image.fromarray(array).convert("RGB")
        scale = side / max(image.size)
        if scale < 1:
            image = image.resize((max(1, round(image.width * scale)),
                                  max(1, round(image.height * scale))),
                                 Image.Resampling.LANCZOS)
        photos.append(np.ascontiguousarray(np.asarray(image, np.uint8)))
    return photos


def quantize(model: Any) -> Any:
    """``model`` (the backend's converted fp32 ``ov.Model``, uint8 NHWC in) quantised."""
    # nncf ships no type information (setup.cfg could list it with openvino's)
    import nncf  # type: ignore[import-untyped]
    from nncf.quantization.advanced_parameters import (  # type: ignore[import-untyped]
        AdvancedQuantizationParameters,
        OverflowFix,
    )

    # NNCF's own logger: nncf.set_log_level would change handlers shared with the app
    logging.getLogger("nncf").setLevel(logging.ERROR)
    photos = calibration_photos()
    return nncf.quantize(
        model, nncf.Dataset(photos, lambda photo: photo[np.newaxis]),
        subset_size=len(photos), preset=nncf.QuantizationPreset.MIXED,
        ignored_scope=nncf.IgnoredScope(types=["MVN"], validate=False),
        advanced_parameters=AdvancedQuantizationParameters(overflow_fix=OverflowFix.ENABLE))
