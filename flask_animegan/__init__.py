"""flask-animegan: photo-to-anime conversion (AnimeGANv2) for Flask apps, fast on CPUs.

The public names are imported on first use, so that a light submodule never imports torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AnimeGAN": ".extension",
    "AnimeGANService": ".service",
    "ConversionError": ".errors",
    "Generator": ".runtime.generator",
    "WeightsError": ".runtime.weights",
    "get_service": ".service",
    "load_generator": ".runtime.weights",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    # "X as X": re-exported for type checkers (mypy --strict cannot read __all__ above)
    from .errors import ConversionError as ConversionError
    from .extension import AnimeGAN as AnimeGAN
    from .runtime.generator import Generator as Generator
    from .runtime.weights import WeightsError as WeightsError
    from .runtime.weights import load_generator as load_generator
    from .service import AnimeGANService as AnimeGANService
    from .service import get_service as get_service


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flask_animegan' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
