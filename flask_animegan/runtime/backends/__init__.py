"""What runs a style's network: torch eager or OpenVINO, behind one small interface.

A backend turns a loaded torch generator into a :class:`Runner` in one precision; a
runner maps RGB pixels to the network's raw output. The engine picks the backend and
precision (``ANIMEGAN_BACKEND``, ``ANIMEGAN_PRECISION``), checks each style's runner
against torch fp32 (:mod:`.fidelity`) and serialises the calls. OpenVINO is an
optional extra: :func:`open_backends` leaves it out, with the reason, when it cannot
be imported.
"""

from __future__ import annotations

from pathlib import Path

from .base import (
    BACKENDS,
    REFERENCE,
    Backend,
    Choice,
    Runner,
    default_cache_dir,
    to_pixels,
    weights_digest,
)

__all__ = ["BACKENDS", "REFERENCE", "Backend", "Choice", "Runner", "default_cache_dir",
           "open_backends", "to_pixels", "weights_digest"]

INSTALL_HINT = "pip install 'flask-animegan[openvino]'"


def open_backends(requested: str, *, cache_dir: Path | None,
                  threads: int) -> tuple[dict[str, Backend], dict[str, str]]:
    """The backends that ``requested`` may use (``auto``: every one importable here),
    torch always among them (the reference and the fallback), and why any other is
    missing: a missing extra is never an error."""
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
