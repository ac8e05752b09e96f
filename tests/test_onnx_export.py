"""``flask animegan export NAME --format onnx``: onnxruntime runs the export of the shipped
style and of a weights file in the models folder (seeded random weights) at >= 40 dB PSNR
against torch fp32 at several sizes, one graph for all; the model card beside it says what
the model is. Each export takes tens of seconds on 2 cores: marked slow."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import IN_CI, build_app, photo
from flask import Flask
from PIL import Image

from flask_animegan import load_generator
from flask_animegan.runtime.onnx_export import OPSET, card_path, psnr_db

pytestmark = pytest.mark.slow

try:
    import onnx
    import onnxruntime
except ImportError:  # the onnx extra
    if IN_CI:
        raise
    pytest.skip("the onnx extra is not installed: pip install -e '.[onnx]'",
                allow_module_level=True)

#: (height, width): the two sizes the issue names, and one neither square nor a multiple of 4.
SIZES = ((256, 256), (512, 512), (301, 522))


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory, models_dir: Path,
            openvino_cache: Path) -> dict[str, tuple[Path, Path]]:
    """Each style's ONNX file and its weights: the shipped ``toon_demo`` and the models
    folder's ``test_style``, both exported through the CLI."""
    out = tmp_path_factory.mktemp("onnx")
    app = build_app(models_dir, openvino_cache, ANIMEGAN_SHIPPED_STYLES=True)
    made = {}
    for name in ("toon_demo", "test_style"):
        target = out / f"{name}.onnx"
        result = app.test_cli_runner().invoke(
            args=["animegan", "export", name, "--format", "onnx", "--output", str(target)])
        assert result.exit_code == 0, result.output
        assert f"exported {name} to {target}" in result.output and "ONNX opset 18" in result.output
        path = app.extensions["animegan"].engine.style(name).path
        made[name] = (target, path)
    return made


def as_input(height: int, width: int) -> torch.Tensor:
    """A real photo at ``height`` x ``width``, as the model takes it: RGB NCHW in [-1, 1]."""
    image = photo("astronaut").resize((width, height), Image.Resampling.LANCZOS)
    array = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)[None] / 127.5 - 1
    return torch.from_numpy(np.ascontiguousarray(array))


@pytest.mark.parametrize("name", ["toon_demo", "test_style"])
def test_onnxruntime_matches_torch_fp32_at_every_size(
        exports: dict[str, tuple[Path, Path]], name: str) -> None:
    target, weights = exports[name]
    network = load_generator(weights)
    session = onnxruntime.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    for height, width in SIZES:
        image = as_input(height, width)
        with torch.inference_mode():
            reference = network(image)
        (result,) = session.run(None, {"image": image.numpy()})
        assert result.shape == (1, 3, height, width)
        value = psnr_db(reference, torch.from_numpy(result))
        assert value >= 40, f"{name} at {height}x{width}: {value:.1f} dB"
    # a batch of two in one run, as the card's "batch" dimension says
    batch = torch.cat([as_input(64, 96), -as_input(64, 96)])
    with torch.inference_mode():
        reference = network(batch)
    (result,) = session.run(None, {"image": batch.numpy()})
    assert psnr_db(reference, torch.from_numpy(result)) >= 40


def test_the_graph_has_dynamic_sizes_the_opset_and_the_licence(
        exports: dict[str, tuple[Path, Path]]) -> None:
    target, _ = exports["toon_demo"]
    model = onnx.load(str(target))
    onnx.checker.check_model(model)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    (image,) = model.graph.input
    assert image.name == "image" and image.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in image.type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["licence"] == "MIT" and props["style"] == "toon_demo"
    assert props["licence_url"] == "https://spdx.org/licenses/MIT.html"


@pytest.mark.parametrize("name,licence", [("toon_demo", "MIT"), ("test_style", "own")])
def test_the_model_card(exports: dict[str, tuple[Path, Path]], name: str,
                        licence: str) -> None:
    target, weights = exports[name]
    card = json.loads(card_path(target).read_text())
    assert card_path(target) == target.with_name(f"{name}.card.json")
    assert card["style"] == name and card["format"] == "onnx" and card["file"] == target.name
    assert card["licence"]["id"] == licence
    assert card["bytes"] == target.stat().st_size
    assert card["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()
    assert card["opset"] == OPSET
    for side in ("input", "output"):
        assert card[side]["layout"] == "NCHW" and card[side]["range"] == [-1.0, 1.0]
        assert card[side]["channels"] == "RGB" and card[side]["dtype"] == "float32"
    assert card["input"]["shape"] == ["batch", 3, "height", "width"]
    assert card["sizes"]["height"][0] == card["sizes"]["width"][0] == 16
    checked = card["checked"]["psnr_db_against_torch_fp32"]
    assert set(checked) == {"256x256", "384x512"} and min(checked.values()) >= 40
    assert card["made_with"]["torch"] == torch.__version__
    assert card["made_with"]["weights"] == weights.name
    assert "dynamo=True" in card["made_with"]["exporter"]


def test_export_options_and_a_torchscript_style(make_app: Callable[..., Flask],
                                                tmp_path: Path) -> None:
    app = make_app()
    runner = app.test_cli_runner()
    both = runner.invoke(args=["animegan", "export", "test_style", "--torchscript",
                               str(tmp_path / "a.ts"), "--output", str(tmp_path / "a.onnx")])
    assert both.exit_code == 2 and "give one of the two" in both.output
    # a TorchScript style carries code, not a state dict: refused, nothing written
    scripted = tmp_path / "models"
    scripted.mkdir()
    assert runner.invoke(args=["animegan", "export", "test_style", "--torchscript",
                               str(scripted / "scripted.ts")]).exit_code == 0
    other = make_app(ANIMEGAN_MODELS_DIR=str(scripted))
    result = other.test_cli_runner().invoke(
        args=["animegan", "export", "scripted", "--output", str(tmp_path / "s.onnx")])
    assert result.exit_code == 1 and "is a TorchScript file" in result.output
    assert not (tmp_path / "s.onnx").exists() and not (tmp_path / "s.card.json").exists()
