"""One conversion, stage by stage: decode -> fit -> (cache) -> infer -> encode.

The service (API and form), the CLI and ``bench/`` all convert through
:meth:`Pipeline.convert`, so what is measured is what is served.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

from .inputs.decoding import fit, to_rgb
from .inputs.formats import MIME_TYPES, encode
from .inputs.isolation import Decoder
from .runtime.catalog import StyleInfo

if TYPE_CHECKING:  # pragma: no cover
    from .cache import NearDuplicateCache
    from .cache.fingerprint import Fingerprint
    from .runtime.engine import InferenceEngine


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


class _Laps:
    """Milliseconds per stage, in order."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round((now - self._clock) * 1000, 2)
        self._clock = now


class Pipeline:
    """Turns uploaded bytes into an encoded anime picture."""

    def __init__(self, decoder: Decoder, engine: InferenceEngine, *, quality: int,
                 cache: NearDuplicateCache | None = None) -> None:
        self.decoder = decoder
        self.engine = engine
        self.quality = quality
        self.cache = cache if cache is not None and cache.enabled else None

    def convert(self, data: bytes, style: StyleInfo, size: int, fmt: str,
                scope: str | None = None) -> Conversion:
        """Convert ``data`` (an image file) with ``style`` to long side ``size`` in ``fmt``.

        With a cache, a near-identical input converted before within ``scope`` (None:
        shared by everyone) reuses that result instead of running the network.
        """
        lap = _Laps()
        decoded = self.decoder.decode(data, size=size, square=style.face)
        fitted = decoded.image  # what the network sees
        lap("decode")
        namespace = (scope, style.name, size, fmt)
        encoded: bytes | None = None
        if self.cache is not None:
            fingerprint = self.cache.fingerprint(fitted)
            encoded = self._from_cache(namespace, fingerprint, fitted.size)
            lap("cache")
        hit = encoded is not None
        if encoded is None:
            result = self.engine.run(fitted, style.name)
            lap("infer")
            encoded = encode(result, fmt, self.quality)
            lap("encode")
            if self.cache is not None:
                self.cache.put(namespace, fingerprint, encoded, fitted.size)
        return Conversion(encoded, MIME_TYPES[fmt], fmt, style.name, fitted.size,
                          cache_hit=hit, face_crop=style.face, input_image=fitted,
                          timings=lap.timings)

    def _from_cache(self, namespace: tuple[Any, ...], fingerprint: Fingerprint,
                    size: tuple[int, int]) -> bytes | None:
        """The cached result for this input, resized to ``size`` if it was sent at a
        slightly different size; None on a miss."""
        assert self.cache is not None
        cached = self.cache.get(namespace, fingerprint)
        if cached is None or cached.size == size:
            return cached.data if cached is not None else None
        result = Image.open(io.BytesIO(cached.data)).convert("RGB")
        result = result.resize(size, Image.Resampling.LANCZOS)
        return encode(result, namespace[3], self.quality)

    def convert_image(self, image: Image.Image, style: StyleInfo, size: int) -> Image.Image:
        """Convert a PIL image (any mode) already in memory; no decode, no cache."""
        fitted = fit(to_rgb(image), size, square=style.face)
        return self.engine.run(fitted, style.name)


def describe_timings(timings: dict[str, Any]) -> str:
    """``decode;dur=3.1, infer;dur=410.2, ...`` for a Server-Timing header."""
    return ", ".join(f"{stage};dur={ms}" for stage, ms in timings.items())
