"""flask-animegan: photo-to-anime conversion (AnimeGANv2) for Flask apps, fast on CPUs."""

from __future__ import annotations

from . import cli as _cli  # noqa: F401  registers `flask animegan ...` on the blueprint
from .errors import ConversionError
from .extension import AnimeGAN
from .generator import Generator
from .service import AnimeGANService, get_service
from .weights import WeightsError, load_generator

__version__ = "0.1.0"

__all__ = [
    "AnimeGAN",
    "AnimeGANService",
    "ConversionError",
    "Generator",
    "WeightsError",
    "get_service",
    "load_generator",
]
