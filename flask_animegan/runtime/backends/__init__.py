"""What runs a style's network: torch eager or OpenVINO (an optional extra, left out with
the reason when it cannot be imported), behind one small interface, :class:`Runner`."""

from __future__ import annotations

from pathlib import Path

from .base import REFERENCE, Backend, Choice, Runner, to_pixels

__all__ = ["REFERENCE", "Backend", "Choice", "Runner", "open_backends", "to_pixels"]

INSTALL_HINT = "pip install 'flask-animegan[openvino]'"


def open_backends(requested: str, *, cache_dir: Path | None,
                  threads: int) -> tuple[dict[str, Backend], dict[str, str]]:
    """The backends ``requested`` may use, torch always among them, and why any is missing."""
    from .torch import TorchBackend

    backends: dict[str, Backend] = {"torch": TorchBackend()}
    missing: dict[str, str] = {}
    if requested in ("auto", "openvino"):
        try:
            from .openvino import OpenVINOBackend
        except ImportError as exc:
            missing["openvino"] = f"openvino cannot be imported ({exc}); {INSTALL_HINT}"
        else:
            backends["openvino"] = OpenVINOBackend(cache_dir=cache_dir, threads=threads)
    return backends, missing
