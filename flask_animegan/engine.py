"""The inference engine: installed styles, loaded models, precision and the queue, together.

Each part has its module (``styles``, ``models``, ``precision``, ``gate``); the engine
runs a fitted image through a style and reports its state.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from . import imaging
from .catalog import StyleInfo
from .config import Settings
from .errors import StyleUnavailable, UnknownStyle
from .gate import InferenceGate
from .models import ModelPool
from .precision import DTYPES, fastest, native_bf16
from .styles import SHIPPED_STYLES_DIR, StyleRegistry
from .weights import load_generator

log = logging.getLogger("flask_animegan")

#: Smallest side the network accepts; smaller inputs are edge-padded, then cropped back.
MIN_SIDE = 16


class EngineEvents(Protocol):
    """What the engine reports as it runs (the metrics implement it)."""

    def queue_changed(self, in_flight: int, queued: int) -> None: ...

    def model_loaded(self, style: str, seconds: float) -> None: ...


class InferenceEngine:
    """Runs the styles of ``models_dir`` (and the shipped ones), one inference at a time.

    The settings come from :class:`flask_animegan.config.Settings` (the caller passes
    them); nothing heavy happens until :meth:`prepare` or the first conversion.
    """

    def __init__(self, models_dir: Path, *, catalog: dict[str, StyleInfo],
                 default_style: str | None, max_loaded: int, max_queue: int,
                 queue_timeout: float, precision: str,
                 events: EngineEvents | None = None,
                 shipped_dir: Path | None = SHIPPED_STYLES_DIR) -> None:
        self.registry = StyleRegistry(models_dir, catalog, default_style,
                                      shipped_dir=shipped_dir)
        self.requested_precision = precision
        # "auto" runs in fp32 until prepare() has timed both on this CPU
        self.precision = "fp32" if precision == "auto" else precision
        self.precision_timings: dict[str, float] = {}
        self.pool = ModelPool(max_loaded=max_loaded, pinned=self.registry.default,
                              dtype=DTYPES[self.precision], events=events)
        self.gate = InferenceGate(max_queue=max_queue, queue_timeout=queue_timeout, events=events)
        self._prepare_lock = threading.Lock()
        self.prepared = False

    @classmethod
    def from_settings(cls, models_dir: Path, settings: Settings, *,
                      catalog: dict[str, StyleInfo] | None = None,
                      events: EngineEvents | None = None) -> InferenceEngine:
        """An engine configured by ``settings`` (ANIMEGAN_DEFAULT_STYLE, _PRECISION, ...)."""
        return cls(models_dir, catalog=catalog or {}, default_style=settings.default_style or None,
                   max_loaded=settings.max_loaded_styles, max_queue=settings.max_queue,
                   queue_timeout=settings.queue_timeout, precision=settings.precision,
                   events=events,
                   shipped_dir=SHIPPED_STYLES_DIR if settings.shipped_styles else None)

    # -- styles (the registry's) ---------------------------------------------------
    @property
    def default_style(self) -> str | None:
        return self.registry.default

    @property
    def models_dir(self) -> Path:
        return self.registry.models_dir

    @property
    def catalog(self) -> dict[str, StyleInfo]:
        return self.registry.catalog

    @property
    def styles(self) -> dict[str, StyleInfo]:
        return self.registry.installed

    @property
    def skipped(self) -> dict[str, str]:
        return self.registry.skipped

    def rescan(self) -> None:
        self.registry.rescan()

    def style(self, name: str | None) -> StyleInfo:
        """The installed style ``name`` (None: the default), or UnknownStyle/StyleUnavailable."""
        return self.registry.get(name)

    def model(self, name: str | None = None) -> nn.Module:
        """The loaded network for a style, loading it on first use."""
        return self.pool.get(self.style(name))

    def broken_details(self) -> dict[str, str]:
        return self.pool.broken_details()

    # -- getting ready ---------------------------------------------------------------
    def prepare(self, warmup_size: int) -> tuple[nn.Module | None, str | None]:
        """Load the default style, settle ``auto`` precision and run one warm-up inference.

        Done once (later calls return at once): in the serving process before it takes
        requests, or by the first conversion. Returns (model, None) or (None, why not).
        """
        with self._prepare_lock:
            if self.prepared:
                return self.pool.pinned_model, None
            started = time.perf_counter()
            try:
                self.model(None)
            except (StyleUnavailable, UnknownStyle) as exc:
                return None, str(exc)
            self._choose_precision(min(warmup_size or 128, 256))
            if warmup_size > 0:
                self.forward(self.model(None), torch.zeros(1, 3, warmup_size, warmup_size))
            self.prepared = True
            log.info("flask_animegan: style %r loaded (%s) and warmed up in %.2f s",
                     self.default_style, self.precision, time.perf_counter() - started)
            return self.pool.pinned_model, None

    def _choose_precision(self, side: int) -> None:
        """Settle ``auto``: time the default style in fp32 and bf16 here, keep the faster."""
        default = self.pool.pinned_model
        if self.requested_precision != "auto" or default is None or not native_bf16():
            return
        path = self.style(None).path
        assert path is not None
        candidates = {"fp32": default,
                      "bf16": load_generator(path).to(dtype=torch.bfloat16)
                                                  .to(memory_format=torch.channels_last)}
        self.precision, self.precision_timings = fastest(candidates, side)
        self.pool.replace_pinned(candidates[self.precision], DTYPES[self.precision])

    # -- running -------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    def run(self, image: Image.Image, style: str | None = None) -> Image.Image:
        """Convert an RGB image with ``style``; waits in the queue for the model."""
        chosen = self.style(style)
        model = self.pool.get(chosen)
        batch = imaging.to_tensor(image)
        with self.gate.slot():
            started = time.perf_counter()
            out = self.forward(model, batch)
            self.gate.record(time.perf_counter() - started, image.width * image.height)
        if not bool(torch.isfinite(out).all()):
            # never return (or cache) what broken weights make of a photo
            raise StyleUnavailable(self.pool.mark_broken(
                chosen, f"{chosen.path}: the network's output is not finite (NaN or inf)"))
        return imaging.to_image(out)

    def forward(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        """Run the network, edge-padding inputs smaller than MIN_SIDE and cropping back.

        Returns float32 (1, 3, H, W) in about [-1, 1].
        """
        height, width = batch.shape[-2:]
        pad_h, pad_w = max(0, MIN_SIDE - height), max(0, MIN_SIDE - width)
        if pad_h or pad_w:
            batch = F.pad(batch, (0, pad_w, 0, pad_h), mode="replicate")
        batch = batch.to(self.dtype).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            out: torch.Tensor = model(batch)
        return out[..., :height, :width].float()

    def status(self) -> dict[str, Any]:
        return {
            "default_style": self.default_style,
            "installed": sorted(self.registry.installed),
            "loaded": self.pool.loaded,
            "broken": self.pool.broken(),
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "precision": self.precision,
            "precision_timings": self.precision_timings,
            **self.gate.status(),
        }
