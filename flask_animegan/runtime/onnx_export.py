"""A style as an ONNX model for phones and browsers: the graph with dynamic height and
width, checked with onnxruntime against torch, and its model card beside it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .catalog import StyleInfo
from .engine import MIN_SIDE

#: ONNX opset of the export: what onnxruntime 1.14 and later (web and mobile included) run.
OPSET = 18
INPUT, OUTPUT = "image", "anime"
#: Sizes (height, width) the export is checked at, and the PSNR it must reach there.
CHECK_SIZES = ((256, 256), (384, 512))
MIN_PSNR_DB = 40.0
#: Dimensions the graph leaves open (torch.export needs a range; onnxruntime ignores it).
MAX_SIDE = 8192


class ExportError(Exception):
    """The export could not be made or did not match torch; nothing was written."""


def card_path(target: Path) -> Path:
    """Where the model card of an export at ``target`` goes: ``NAME.card.json`` beside it."""
    return target.with_name(f"{target.stem}.card.json")


def psnr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """PSNR of ``other`` against ``reference``, both in [-1, 1] (peak: the range of 2)."""
    mse = float(((reference.float() - other.float()) ** 2).mean()) / 4
    return math.inf if mse == 0 else 10 * math.log10(1 / mse)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def export_onnx(network: nn.Module, style: StyleInfo, target: Path, *,
                max_side: int = 512) -> dict[str, Any]:
    """Write ``network`` (the generator of ``style``) to ``target`` as ONNX and its model
    card to :func:`card_path`, once onnxruntime matches torch; returns the card."""
    try:
        import onnx
        import onnxruntime
        import onnxscript  # noqa: F401 - torch's ONNX exporter needs it
    except ImportError as exc:
        raise ExportError(f"ONNX export needs {exc.name}: pip install "
                          "'flask-animegan[onnx]'") from None
    if isinstance(network, torch.jit.ScriptModule):
        raise ExportError(f"style {style.name!r} is a TorchScript file: ONNX export needs the "
                          "generator's state dict (a .pt file saved with torch.save)")
    dims = {2: torch.export.Dim("height", min=MIN_SIDE, max=MAX_SIDE),
            3: torch.export.Dim("width", min=MIN_SIDE, max=MAX_SIDE)}
    probe = torch.zeros(1, 3, 64, 80)
    try:  # torch.export traces it; the exporter prints progress we do not want
        with contextlib.redirect_stdout(io.StringIO()):
            program = torch.onnx.export(
                network, (probe,), input_names=[INPUT], output_names=[OUTPUT],
                dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=64), **dims}},
                dynamo=True, opset_version=OPSET, optimize=True, verbose=False)
    except Exception as exc:  # the exporter raises many types
        raise ExportError(f"torch could not export style {style.name!r} to ONNX "
                          f"({exc.__class__.__name__}: {str(exc)[:200]})") from exc
    assert program is not None  # dynamo=True returns the program
    model = program.model_proto
    licence = {"id": style.licence, "url": style.licence_url, "note": style.licence_note}
    for key, text in {"style": style.name, "licence": style.licence,
                       "licence_url": style.licence_url or "",
                       "input": "RGB float32 NCHW in [-1, 1]",
                       "output": "RGB float32 NCHW in [-1, 1]"}.items():
        model.metadata_props.add(key=key, value=text)
    data = model.SerializeToString()
    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    checked: dict[str, float] = {}
    for height, width in CHECK_SIZES:
        image = torch.rand(1, 3, height, width,
                           generator=torch.Generator().manual_seed(height * width)) * 2 - 1
        with torch.inference_mode():
            reference = network(image)
        result = torch.from_numpy(session.run(None, {INPUT: image.numpy()})[0])
        value = checked[f"{height}x{width}"] = psnr_db(reference, result)
        if value < MIN_PSNR_DB:
            raise ExportError(f"onnxruntime's output differs from torch's at {height}x{width} "
                              f"px ({value:.1f} dB < {MIN_PSNR_DB} dB); nothing written")
    card = {
        "style": style.name,
        "description": style.description,
        "licence": licence,
        "format": "onnx",
        "file": target.name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "opset": OPSET,
        "ir_version": model.ir_version,
        "input": {"name": INPUT, "dtype": "float32", "layout": "NCHW",
                  "shape": ["batch", 3, "height", "width"], "channels": "RGB",
                  "range": [-1.0, 1.0], "from_pixels": "value / 127.5 - 1"},
        "output": {"name": OUTPUT, "dtype": "float32", "layout": "NCHW",
                   "shape": ["batch", 3, "height", "width"], "channels": "RGB",
                   "range": [-1.0, 1.0], "to_pixels": "(value + 1) * 127.5, clipped to 0..255"},
        "sizes": {"height": [MIN_SIDE, MAX_SIDE], "width": [MIN_SIDE, MAX_SIDE],
                  "served_long_side": max_side, "face_crop": style.face,
                  "note": ("any height and width; the server runs the long side up to "
                           "ANIMEGAN_MAX_SIDE in one piece and larger photos in tiles")},
        "checked": {"onnxruntime": onnxruntime.__version__, "min_psnr_db": MIN_PSNR_DB,
                    "psnr_db_against_torch_fp32": {k: round(v, 1) for k, v in checked.items()}},
        "made_with": {"exporter": "torch.onnx.export(dynamo=True): torch.export, onnxscript",
                      "torch": torch.__version__, "onnx": onnx.__version__,
                      "onnxscript": _version("onnxscript"),
                      "flask_animegan": _version("flask-animegan"),
                      "weights": style.path.name if style.path else None},
    }
    _write(target, data)
    _write(card_path(target), (json.dumps(card, indent=1) + "\n").encode())
    return card


def _write(target: Path, data: bytes) -> None:
    """``data`` into ``target`` through a temporary file, so a failure leaves no half file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part")
    try:
        partial.write_bytes(data)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
