"""Finding, verifying and loading style weights (plain state dicts or TorchScript)."""

from __future__ import annotations

import contextlib
import hashlib
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from .catalog import STYLE_NAME
from .generator import Generator

WEIGHT_SUFFIXES = (".pt", ".pth", ".ts")


@contextlib.contextmanager
def torchscript_quietly() -> Iterator[None]:
    """Run ``torch.jit`` calls without torch's deprecation notice (we still support them)."""
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("ignore", r"`torch\.jit\.[a-z_]+` is deprecated", category)
        yield


class WeightsError(Exception):
    """A weights file that cannot serve as a generator; the message names the file."""


def file_git_blob_sha1(path: Path) -> str:
    """The SHA-1 git gives this file (``git hash-object``)."""
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_style_files(models_dir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """The weights files in ``models_dir`` by style name, and those not served with why."""
    found: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for path in sorted(models_dir.iterdir()) if models_dir.is_dir() else ():
        if path.suffix not in WEIGHT_SUFFIXES:
            continue
        if not STYLE_NAME.fullmatch(path.stem):
            skipped[path.name] = ("not a valid style name (lowercase letters, digits, '_' and "
                                  "'-', at most 64, starting with a letter or digit); rename it")
        elif path.is_file():
            found.setdefault(path.stem, path)
    return found, skipped


def is_torchscript(path: Path) -> bool:
    """TorchScript archives carry compiled code (``*/code/``); ``torch.save`` ones do not."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except zipfile.BadZipFile:
        return False
    return any("/code/" in name or name.endswith("/constants.pkl") for name in names)


def load_generator(path: Path) -> nn.Module:
    """Load ``path`` as an eval-mode float32 generator, or raise WeightsError naming it."""
    if not path.is_file():
        raise WeightsError(f"{path}: weights file is missing")
    if is_torchscript(path):
        return _load_torchscript(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a bad file
        raise WeightsError(
            f"{path}: not a PyTorch state dict or TorchScript file ({exc.__class__.__name__}); "
            "re-download it with `flask animegan pull NAME` or remove it"
        ) from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{path}: does not hold a state dict of tensors")
    model = Generator()
    expected = model.state_dict()
    problems = {"missing": sorted(set(expected) - set(state)),
                "unexpected": sorted(set(state) - set(expected)),
                "wrong shape": sorted(k for k in set(expected) & set(state)
                                      if state[k].shape != expected[k].shape)}
    details = [f"{len(keys)} {label} (e.g. {', '.join(keys[:3])})"
               for label, keys in problems.items() if keys]
    if details:
        raise WeightsError(f"{path}: not AnimeGANv2 generator weights: {'; '.join(details)}")
    not_finite = sorted(k for k, v in state.items()
                        if v.is_floating_point() and not bool(torch.isfinite(v).all()))
    if not_finite:
        raise WeightsError(f"{path}: {len(not_finite)} tensors hold NaN or infinite values "
                           f"(e.g. {', '.join(not_finite[:3])}); the file is corrupt, "
                           "re-download or retrain it")
    # fp16 files are upcast: inference runs in float32.
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return model.eval().requires_grad_(False)


def _load_torchscript(path: Path) -> nn.Module:
    try:
        with torchscript_quietly():
            module: torch.jit.ScriptModule = torch.jit.load(str(path), map_location="cpu")
    except Exception as exc:
        raise WeightsError(f"{path}: broken TorchScript file ({exc})") from exc
    module.eval()
    try:
        with torch.inference_mode():
            out = module(torch.zeros(1, 3, 32, 32))
    except Exception as exc:
        raise WeightsError(f"{path}: TorchScript module does not run on a 1x3x32x32 image "
                           f"({exc.__class__.__name__})") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (1, 3, 32, 32):
        raise WeightsError(f"{path}: TorchScript module must map (N,3,H,W) to (N,3,H,W)")
    if not bool(torch.isfinite(out).all()):
        raise WeightsError(f"{path}: TorchScript module gives NaN or infinite values")
    return module
