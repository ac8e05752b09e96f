"""Portrait mode: faces found, aligned by their eyes, converted with a face style, pasted back.
Light to import: OpenCV and NumPy load on the first call; no torch, no Flask."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["MAX_FACES", "Face", "align_face", "face_crops", "find_faces", "paste_faces"]

from .face import MAX_FACES, Face

if TYPE_CHECKING:
    from .align import align_face
    from .blend import face_crops, paste_faces
    from .detect import find_faces

_LAZY = {"find_faces": "detect", "align_face": "align", "face_crops": "blend", "paste_faces": "blend"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
