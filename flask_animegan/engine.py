"""The inference engine: styles on disk, loaded models, one inference at a time, a bounded queue.

Torch already spreads one inference over every intra-op thread, so running two at
once on the same cores only adds contention. The engine therefore serialises
inference per process and lets at most ``max_queue`` requests wait; the rest are
turned away at once with a Retry-After estimate instead of piling up threads.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from cachetools import LRUCache
from PIL import Image
from torch import nn

from . import imaging
from .catalog import SHIPPED_STYLES, STYLE_NAME, KnownStyle
from .errors import Overloaded, StyleUnavailable, UnknownStyle
from .weights import WeightsError, find_style_files, load_generator, skipped_style_files

log = logging.getLogger("flask_animegan")

#: Smallest side the network accepts; smaller inputs are edge-padded, then cropped back.
MIN_SIDE = 16
#: Without ANIMEGAN_DEFAULT_STYLE the first installed of these is the default (else the
#: first installed style alphabetically): an official style beats the shipped demo.
PREFERRED_DEFAULTS = ("paprika", "face_paint_512_v2", "toon_demo")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX) and oneDNN can use it."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return (("avx512_bf16" in flags or "amx_bf16" in flags)
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def time_forward(model: nn.Module, dtype: torch.dtype, side: int, runs: int = 2) -> float:
    """Best-of-``runs`` seconds of one channels-last inference on a side x side image."""
    batch = torch.zeros(1, 3, side, side, dtype=dtype).contiguous(memory_format=torch.channels_last)
    best = float("inf")
    with torch.inference_mode():
        model(batch)  # first call: oneDNN builds its kernels for this shape
        for _ in range(runs):
            started = time.perf_counter()
            model(batch)
            best = min(best, time.perf_counter() - started)
    return best


def configure_torch_threads(threads: int) -> None:
    """Cap torch's intra-op threads to ``threads`` and inter-op threads to 1."""
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # only settable before inter-op work starts
        torch.set_num_interop_threads(1)


@dataclass(frozen=True)
class Style:
    name: str
    path: Path
    face: bool
    licence: str
    description: str


class EngineEvents(Protocol):
    """What the engine reports as it runs (the metrics implement it)."""

    def queue_changed(self, in_flight: int, queued: int) -> None: ...

    def model_loaded(self, style: str, seconds: float) -> None: ...


class InferenceEngine:
    """Loads styles from ``models_dir`` and runs them, one inference at a time."""

    def __init__(self, models_dir: Path, *, catalog: dict[str, KnownStyle],
                 default_style: str | None = None, max_loaded: int = 3, max_queue: int = 4,
                 queue_timeout: float = 60.0, precision: str = "fp32",
                 events: EngineEvents | None = None) -> None:
        self.models_dir = models_dir
        self.events = events
        self.requested_precision = precision
        # "auto" runs in fp32 until choose_precision() has timed both on this CPU
        self.precision = "fp32" if precision == "auto" else precision
        self.precision_timings: dict[str, float] = {}
        self.catalog = catalog
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self._styles: dict[str, Style] = {}
        self._models: LRUCache = LRUCache(maxsize=max_loaded)
        self._default_model: nn.Module | None = None
        # name -> (public message, details for the log and the CLI, file mtime)
        self._broken: dict[str, tuple[str, str, float | None]] = {}
        self.skipped: dict[str, str] = {}  # file name -> why it is not a style
        self._load_lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending = 0
        self._seconds_per_inference = 1.0
        self.rescan()
        #: Fixed here, once: files that appear later (``flask animegan pull``) never
        #: change which style a request without ``style`` gets.
        self.default_style: str | None = default_style or self._preferred_default()

    # -- styles -----------------------------------------------------------------
    def rescan(self) -> None:
        """Pick up weights files added to (or removed from) the models folder."""
        styles = {}
        for name, path in find_style_files(self.models_dir).items():
            known = self.catalog.get(name)
            if known is not None:
                licence, description = known.licence, known.description
            else:
                licence, description = SHIPPED_STYLES.get(
                    name, ("unknown (a file you installed)", ""))
            styles[name] = Style(name, path, face=bool(known and known.face), licence=licence,
                                 description=description)
        self._styles = styles
        skipped = skipped_style_files(self.models_dir)
        for name, why in skipped.items():
            if name not in self.skipped:
                log.warning("flask_animegan: ignoring %s in %s: %s", name, self.models_dir, why)
        self.skipped = skipped

    @property
    def styles(self) -> dict[str, Style]:
        return dict(self._styles)

    def _preferred_default(self) -> str | None:
        for name in PREFERRED_DEFAULTS:
            if name in self._styles:
                return name
        return next(iter(sorted(self._styles)), None)

    def style(self, name: str | None) -> Style:
        """The installed style ``name`` (None: the default), or UnknownStyle/StyleUnavailable."""
        if name is None:
            name = self.default_style
            if name is None:
                raise StyleUnavailable(
                    "no style is installed; run `flask animegan pull paprika` (or put a "
                    f"NAME.pt file into {self.models_dir}) and restart the server")
        if not STYLE_NAME.fullmatch(name):
            raise UnknownStyle(f"{name!r} is not a valid style name")
        if name not in self._styles:
            self.rescan()
        if name not in self._styles:
            hint = (f"; it is an official style: run `flask animegan pull {name}`"
                    if name in self.catalog else "")
            raise UnknownStyle(f"style {name!r} is not installed{hint}. "
                               f"Installed: {', '.join(sorted(self._styles)) or 'none'}")
        return self._styles[name]

    def model(self, name: str | None = None) -> nn.Module:
        """The loaded network for a style, loading it on first use (LRU-bounded)."""
        style = self.style(name)
        if style.name == self.default_style and self._default_model is not None:
            return self._default_model
        with self._load_lock:
            model = self._models.get(style.name)
            if model is None:
                # a file that failed to load is retried only once it has changed
                failed = self._broken.get(style.name)
                if failed and failed[2] == _mtime(style.path):
                    raise StyleUnavailable(failed[0])
                try:
                    started = time.perf_counter()
                    model = self._prepare(load_generator(style.path))
                    if self.events is not None:
                        self.events.model_loaded(style.name, time.perf_counter() - started)
                except WeightsError as exc:
                    raise StyleUnavailable(self.mark_broken(style, str(exc))) from exc
                self._broken.pop(style.name, None)
                if style.name == self.default_style:
                    self._default_model = model  # pinned: never evicted
                else:
                    self._models[style.name] = model
            return model

    def mark_broken(self, style: Style, details: str) -> str:
        """Record that ``style`` cannot serve; returns the public message.

        The details (with the file's path) go to the log and ``flask animegan styles``;
        visitors only learn that the style is unavailable.
        """
        public = (f"style {style.name!r} is unavailable: its weights cannot be used. "
                  "The server's log says why; choose another style")
        if self._broken.get(style.name, ("", ""))[1] != details:
            log.error("flask_animegan: style %r cannot be used: %s", style.name, details)
        self._broken[style.name] = (public, details, _mtime(style.path))
        self._models.pop(style.name, None)
        if style.name == self.default_style:
            self._default_model = None
        return public

    def load_default(self) -> tuple[nn.Module | None, str | None]:
        """Load the default style now (at startup): (model, None) or (None, why not)."""
        try:
            return self.model(None), None
        except (StyleUnavailable, UnknownStyle) as exc:
            return None, str(exc)

    # -- running -----------------------------------------------------------------
    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold the model for one inference; 503 when the queue is full or the wait too long."""
        with self._state_lock:
            if self._pending >= 1 + self.max_queue:
                raise Overloaded("the server is busy converting other photos; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            self._pending += 1
            self._report_queue(running=self._run_lock.locked())
        try:
            if not self._run_lock.acquire(timeout=self.queue_timeout):
                raise Overloaded("timed out waiting for a free converter; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            try:
                with self._state_lock:
                    self._report_queue(running=True)
                yield
            finally:
                self._run_lock.release()
        finally:
            with self._state_lock:
                self._pending -= 1
                self._report_queue(running=self._run_lock.locked())

    def _report_queue(self, running: bool) -> None:
        if self.events is not None:
            self.events.queue_changed(int(running), max(0, self._pending - int(running)))

    def retry_after(self) -> int:
        return max(1, math.ceil(self._seconds_per_inference * max(1, self._pending)))

    def run(self, image: Image.Image, style: str | None = None) -> Image.Image:
        """Convert an RGB image with ``style``; waits in the queue for the model."""
        chosen = self.style(style)
        model = self.model(chosen.name)
        batch = imaging.to_tensor(image)
        with self.slot():
            started = time.perf_counter()
            out = self.forward(model, batch)
            elapsed = time.perf_counter() - started
        if not bool(torch.isfinite(out).all()):
            # never return (or cache) what broken weights make of a photo
            raise StyleUnavailable(self.mark_broken(
                chosen, f"{chosen.path}: the network's output is not finite (NaN or inf)"))
        # per-pixel cost, smoothed, scaled to a 512 x 512 image for Retry-After estimates
        per_megapixel = elapsed / max(image.width * image.height / 262_144, 0.05)
        self._seconds_per_inference = 0.8 * self._seconds_per_inference + 0.2 * per_megapixel
        return imaging.to_image(out)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.precision]

    def _prepare(self, model: nn.Module) -> nn.Module:
        """Channels-last layout (oneDNN's fast path) in the engine's dtype."""
        return model.to(dtype=self.dtype, memory_format=torch.channels_last)

    def choose_precision(self, side: int = 128) -> str:
        """Settle ``auto``: time the default style in fp32 and bf16 here, keep the faster.

        CPU flags do not tell: with AVX512-BF16 but no AMX, some CPUs run bf16
        convolutions slower than fp32 (measured on an Intel Xeon: 1.47 s vs 1.30 s
        at 512 px), while others run them twice as fast (AMD Zen 4).
        """
        if self.requested_precision != "auto" or self._default_model is None:
            return self.precision
        if not native_bf16():
            self.precision = "fp32"
            return self.precision
        style = self.style(None)
        candidates = {"fp32": self._default_model}
        candidates["bf16"] = load_generator(style.path).to(
            dtype=torch.bfloat16, memory_format=torch.channels_last)
        self.precision_timings = {name: round(time_forward(model, DTYPES[name], side), 4)
                                  for name, model in candidates.items()}
        self.precision = min(self.precision_timings, key=self.precision_timings.get)
        self._default_model = candidates[self.precision]
        return self.precision

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
            out = model(batch)
        return out[..., :height, :width].float()

    def warm_up(self, side: int) -> None:
        """One inference on the default style so the first real request is not slow."""
        if side > 0 and self._default_model is not None:
            self.forward(self._default_model, torch.zeros(1, 3, side, side))

    def broken_details(self) -> dict[str, str]:
        """Why each broken style fails, with file paths: for the CLI and the log only."""
        return {name: details for name, (_, details, _) in self._broken.items()}

    def status(self) -> dict[str, Any]:
        with self._state_lock:
            in_flight = 1 if self._run_lock.locked() else 0
            pending = self._pending
        loaded = list(self._models.keys())
        if self._default_model is not None:
            loaded.insert(0, self.default_style)
        return {
            "default_style": self.default_style,
            "installed": sorted(self._styles),
            "loaded": loaded,
            "broken": {name: public for name, (public, _, _) in self._broken.items()},
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "precision": self.precision,
            "precision_timings": self.precision_timings,
            "in_flight": in_flight,
            "queued": max(0, pending - in_flight),
            "max_queue": self.max_queue,
        }
