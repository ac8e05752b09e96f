"""The per-app conversion service stored in ``app.extensions["animegan"]``."""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import current_app
from PIL import Image

from . import imaging
from .cache import NearDuplicateCache, ResultStore
from .config import OUTPUT_FORMATS
from .decoders import Decoder
from .engine import MIN_SIDE, InferenceEngine
from .errors import BadParameter, ConversionError
from .metrics import Metrics

FORMAT_ALIASES = {"jpg": "jpeg"}
#: The photo the style picker's samples are made from (NASA's public-domain portrait of
#: Eileen Collins, as shipped in scikit-image's ``data.astronaut``).
SAMPLE_PHOTO = Path(__file__).resolve().parent / "static" / "sample-photo.jpg"


@dataclass
class Conversion:
    """The outcome of converting one upload."""

    data: bytes
    mimetype: str
    format: str
    style: str
    size: tuple[int, int]
    cache_hit: bool
    face_crop: bool
    input_image: Image.Image  # the decoded, fitted input (what the network saw)
    timings: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds


class AnimeGANService:
    """Everything one app needs to convert photos: engine, cache, result store, limits."""

    def __init__(self, config: dict[str, Any], engine: InferenceEngine,
                 cache: NearDuplicateCache, results: ResultStore, limiter: Any,
                 decoder: Decoder, metrics: Metrics | None = None) -> None:
        self.engine = engine
        self.decoder = decoder
        self.cache_scope: str = config["ANIMEGAN_CACHE_SCOPE"]
        self.rate_limit_headers = True  # False when the host's Limiter adds its own
        self.health_details: str = config["ANIMEGAN_HEALTH_DETAILS"]
        self.cache = cache
        self.results = results
        self.limiter = limiter
        self.metrics = metrics
        self.sample_size: int = config["ANIMEGAN_SAMPLE_SIZE"]
        self._samples: dict[str, bytes] = {}
        self.max_side: int = config["ANIMEGAN_MAX_SIDE"]
        self.max_pixels: int = config["ANIMEGAN_MAX_PIXELS"]
        self.max_upload_bytes: int = config["ANIMEGAN_MAX_UPLOAD_BYTES"]
        self.output_format: str = config["ANIMEGAN_OUTPUT_FORMAT"]
        self.quality: int = config["ANIMEGAN_JPEG_QUALITY"]
        self.base_template: str = config["ANIMEGAN_BASE_TEMPLATE"]
        self.rate_limit: str = config["ANIMEGAN_RATE_LIMIT"] or ""

    # -- parameters ----------------------------------------------------------------
    def parse_size(self, raw: Any) -> int:
        """A requested output size (long side), defaulting to ANIMEGAN_MAX_SIDE."""
        if raw is None or raw == "":
            return self.max_side
        try:
            size = int(str(raw).strip())
        except ValueError:
            size = -1
        if not MIN_SIDE <= size <= self.max_side:
            raise BadParameter(f"size must be a whole number of pixels from {MIN_SIDE} to "
                               f"{self.max_side}, got {str(raw)[:20]!r}")
        return size

    def parse_format(self, raw: Any) -> str:
        if raw is None or raw == "":
            return self.output_format
        fmt = FORMAT_ALIASES.get(str(raw).lower(), str(raw).lower())
        if fmt not in OUTPUT_FORMATS:
            raise BadParameter(f"format must be one of {', '.join(OUTPUT_FORMATS)}, "
                               f"got {str(raw)[:20]!r}")
        return fmt

    # -- converting ----------------------------------------------------------------
    def convert(self, image: Image.Image, style: str | None = None,
                size: int | None = None) -> Image.Image:
        """Convert a PIL image (any mode) with ``style`` at long side ``size``; no cache."""
        chosen = self.engine.style(style)
        fitted = imaging.fit(imaging.to_rgb(image), self.parse_size(size), square=chosen.face)
        return self.engine.run(fitted, chosen.name)

    def convert_upload(self, data: bytes, style: str | None = None, size: Any = None,
                       fmt: Any = None, client: str | None = None) -> Conversion:
        """Decode an uploaded file, convert it (or reuse a cached result), encode it.

        ``client`` is the cache scope key (the rate limit's client key): with
        ANIMEGAN_CACHE_SCOPE = "client" results are shared only within it.
        """
        chosen = self.engine.style(style)
        size = self.parse_size(size)
        fmt = self.parse_format(fmt)
        timings: dict[str, float] = {}
        clock = time.perf_counter()

        def lap(stage: str) -> None:
            nonlocal clock
            now = time.perf_counter()
            timings[stage] = round((now - clock) * 1000, 2)
            clock = now

        fitted = self.decoder.decode(data, size=size, square=chosen.face)
        lap("decode")
        scope = client if self.cache_scope == "client" else None
        namespace = (scope, chosen.name, size, fmt)
        fingerprint = self.cache.fingerprint(fitted) if self.cache.enabled else None
        cached = self.cache.get(namespace, fingerprint) if fingerprint else None
        lap("cache")
        if cached is not None and cached.size == fitted.size:
            encoded = cached.data
        else:
            if cached is not None:  # same photo sent at a slightly different size
                result = Image.open(io.BytesIO(cached.data)).convert("RGB")
                result = result.resize(fitted.size, Image.Resampling.LANCZOS)
            else:
                result = self.engine.run(fitted, chosen.name)
                lap("infer")
            encoded = imaging.encode(result, fmt, self.quality)
            if cached is None and fingerprint is not None:
                self.cache.put(namespace, fingerprint, encoded, fitted.size)
        lap("encode")
        return Conversion(encoded, imaging.MIME_TYPES[fmt], fmt, chosen.name, fitted.size,
                          cache_hit=cached is not None, face_crop=chosen.face,
                          input_image=fitted, timings=timings)

    def style_sample(self, name: str) -> bytes:
        """A small JPEG of the bundled sample photo in style ``name`` (made once, then kept)."""
        sample = self._samples.get(name)
        if sample is None:
            chosen = self.engine.style(name)
            with Image.open(SAMPLE_PHOTO) as photo:
                fitted = imaging.fit(photo.convert("RGB"), self.sample_size, square=chosen.face)
            sample = imaging.encode(self.engine.run(fitted, chosen.name), "jpeg", 85)
            self._samples[chosen.name] = sample
        return sample

    def make_samples(self) -> None:
        """Make every installed style's sample now (at startup), skipping broken styles."""
        if not self.sample_size:
            return
        for name in self.engine.styles:
            try:
                self.style_sample(name)
            except ConversionError:
                pass

    def styles_info(self) -> list[dict[str, Any]]:
        """Installed and pullable styles, for the page and ``GET /styles``."""
        installed = self.engine.styles
        default = self.engine.default_style
        broken = self.engine.status()["broken"]
        names = sorted(set(installed) | set(self.engine.catalog))
        return [{
            "name": name,
            "installed": name in installed,
            "default": name == default,
            "usable": name in installed and name not in broken,
            "face_crop": (installed[name].face if name in installed
                          else self.engine.catalog[name].face),
            "licence": (installed[name].licence if name in installed
                        else self.engine.catalog[name].licence),
            "description": (installed[name].description if name in installed
                            else self.engine.catalog[name].description),
            **({"error": broken[name]} if name in broken else {}),
        } for name in names]

    def health(self, details: bool = True) -> dict[str, Any]:
        """``{"status": ...}`` (ok, degraded, no_model); with ``details``, the engine's state."""
        engine = self.engine.status()
        default = engine["default_style"]
        if default not in engine["installed"] or default in engine["broken"]:
            status = "no_model"
        elif engine["broken"]:
            status = "degraded"
        else:
            status = "ok"
        if not details:
            return {"status": status}
        return {"status": status, "pid": os.getpid(), **engine, "cache": self.cache.stats(),
                "decoder": self.decoder.status()}


def get_service() -> AnimeGANService:
    """The current app's AnimeGAN service; explains the fix when the extension is missing."""
    try:
        return current_app.extensions["animegan"]
    except KeyError:
        raise RuntimeError(
            "flask_animegan is not initialised on this app: did you forget "
            "AnimeGAN(app) or animegan.init_app(app)?"
        ) from None
