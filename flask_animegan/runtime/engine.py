"""The inference engine: picks the backend and precision, runs a fitted image through a
style and reports its state (styles, models, backends, precision and gate do the parts)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..config import Settings
from ..errors import Overloaded, StyleUnavailable, UnknownStyle
from ..gate import Gate, QueueEvents
from .backends import REFERENCE, Backend, Choice, Runner, open_backends, to_pixels
from .backends.base import default_cache_dir, weights_digest
from .backends.fidelity import fidelity_db, min_db
from .backends.torch import TorchRunner
from .catalog import EVERY_LICENCE, LicencePolicy, StyleInfo
from .generator import Generator
from .models import LoadedStyle, LoadEvents, ModelPool
from .precision import DTYPES, fastest
from .styles import SHIPPED_STYLES_DIR, StyleRegistry
from .tiles import TileProgress, run_tiled
from .weights import load_generator

if TYPE_CHECKING:  # importing it imports openvino, an optional extra
    from .backends.openvino import OpenVINOBackend

log = logging.getLogger("flask_animegan")

#: Smallest side the network accepts; smaller inputs are edge-padded, then cropped back.
MIN_SIDE = 16
#: Seconds without a conversion after which OpenVINO's buffers go back to the system
#: (not after each one: remaking them slows the next; docs/deployment.md).
IDLE_RELEASE_S = 3.0


class EngineEvents(QueueEvents, LoadEvents, Protocol):
    """What the engine reports as it runs (the metrics implement it)."""


class InferenceEngine:
    """Runs the installed styles, one inference at a time; nothing heavy happens (and
    ``auto`` serves torch fp32) until :meth:`prepare` or the first conversion."""

    def __init__(self, models_dir: Path, *, catalog: dict[str, StyleInfo],
                 default_style: str | None, max_loaded: int, max_queue: int,
                 queue_timeout: float, precision: str, backend: str = "auto",
                 model_cache_dir: Path | None = None, events: EngineEvents | None = None,
                 shipped_dir: Path | None = SHIPPED_STYLES_DIR,
                 policy: LicencePolicy = EVERY_LICENCE) -> None:
        self.registry = StyleRegistry(models_dir, catalog, default_style,
                                      shipped_dir=shipped_dir, policy=policy)
        self.requested_backend = backend
        self.requested_precision = precision
        self._model_cache_dir = model_cache_dir
        # opened on first use (the warm-up): importing openvino is not for every `flask` command
        self._backends: dict[str, Backend] | None = None
        self._missing_backends: dict[str, str] = {}
        self._backends_lock = threading.Lock()
        self.choice = Choice("torch" if backend == "auto" else backend,
                             "fp32" if precision == "auto" else precision)
        if precision == "int8":  # settled by prepare() too: torch has no int8
            self.choice = REFERENCE
        self.timings: dict[str, float] = {}  # candidate -> seconds, when auto timed them
        self.rejected: dict[str, str] = {}  # candidate -> why the fidelity guard refused it
        self.pool = ModelPool(max_loaded=max_loaded, pinned=self.registry.default,
                              loader=self._load_style, events=events)
        self.gate = Gate(max_queue=max_queue, queue_timeout=queue_timeout, events=events)
        self._prepare_lock = threading.Lock()
        self.prepared = False
        self._release_lock = threading.Lock()
        self._release_timer: threading.Timer | None = None

    @property
    def backends(self) -> dict[str, Backend]:
        """The backends this engine may use, torch always among them (opened on first use)."""
        with self._backends_lock:
            if self._backends is None:
                requested = self.requested_backend
                self._backends, self._missing_backends = open_backends(
                    requested, cache_dir=self._model_cache_dir, threads=torch.get_num_threads())
                if requested != "auto" and requested not in self._backends:
                    log.warning("flask_animegan: ANIMEGAN_BACKEND=%s, but %s; using torch",
                                requested,
                                self._missing_backends.get(requested, "it is unavailable"))
                    self.choice = Choice("torch", self.choice.precision)
            return self._backends

    @classmethod
    def from_settings(cls, models_dir: Path, settings: Settings, *,
                      catalog: dict[str, StyleInfo] | None = None,
                      events: EngineEvents | None = None) -> InferenceEngine:
        """An engine configured by ``settings`` (ANIMEGAN_DEFAULT_STYLE, _BACKEND, ...)."""
        return cls(models_dir, catalog=catalog or {}, default_style=settings.default_style or None,
                   max_loaded=settings.max_loaded_styles, max_queue=settings.max_queue,
                   queue_timeout=settings.queue_timeout, precision=settings.precision,
                   backend=settings.backend, model_cache_dir=model_cache_dir(settings),
                   events=events,
                   shipped_dir=SHIPPED_STYLES_DIR if settings.shipped_styles else None,
                   policy=LicencePolicy.of(settings.allowed_licences))

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

    def style(self, name: str | None) -> StyleInfo:
        """The installed style ``name`` (None: the default), or UnknownStyle/StyleUnavailable."""
        return self.registry.get(name)

    def model(self, name: str | None = None) -> nn.Module:
        """The torch network of a style, loading the style on first use."""
        return self.pool.get(self.style(name)).network

    def runner(self, name: str | None = None) -> Runner:
        """What runs a style (its backend and precision), loading the style on first use."""
        return self.pool.get(self.style(name)).runner

    # -- loading a style -------------------------------------------------------------
    def _load_style(self, style: StyleInfo) -> LoadedStyle:
        assert style.path is not None, "only installed styles are loaded"
        return self._loaded(style.path, load_generator(style.path), self.choice)

    def _loaded(self, path: Path, network: nn.Module, choice: Choice) -> LoadedStyle:
        """``network`` run by ``choice``; one failing the fidelity guard falls back to fp32."""
        if choice == REFERENCE or choice.backend not in self.backends:
            return LoadedStyle(network, TorchRunner(network, "fp32"))
        if choice.backend == "torch":
            # the guard's reference needs fp32 weights; the runner converts them in place
            reference = TorchRunner(load_generator(path), "fp32")
        else:
            reference = TorchRunner(network, "fp32")
        try:
            candidate = self.backends[choice.backend].runner(network, choice.precision, path)
            value = fidelity_db(weights_digest(path), reference, candidate)
        except Exception as exc:  # noqa: BLE001 - a backend failing is never fatal
            log.exception("flask_animegan: %s cannot run %s; using torch fp32", choice, path.name)
            note = f"{choice} failed ({exc.__class__.__name__}: {str(exc)[:200]}); torch fp32 used"
            return LoadedStyle(reference.network, reference, note=note)
        if value < min_db(choice.precision):
            if choice.precision == "int8":  # served in the same backend's fp32
                fallback = self._loaded(path, network, Choice(choice.backend, "fp32"))
            else:
                fallback = LoadedStyle(reference.network, reference, fidelity_db=value)
            note = (f"{choice} reached only {value:.1f} dB PSNR against torch fp32 on the guard "
                    f"photos (needs {min_db(choice.precision):g}); {self.serving(fallback)} used"
                    + (f" ({fallback.note})" if fallback.note else ""))
            log.warning("flask_animegan: style %s: %s", path.stem, note)
            return LoadedStyle(fallback.network, fallback.runner,
                               fidelity_db=fallback.fidelity_db, note=note)
        return LoadedStyle(network, candidate, fidelity_db=round(value, 1))

    # -- getting ready ---------------------------------------------------------------
    def prepare(self, warmup_size: int) -> tuple[nn.Module | None, str | None]:
        """Load the default style, settle ``auto`` and warm up, once; returns (the default's
        network, None) or (None, why not)."""
        with self._prepare_lock:
            if self.prepared:
                pinned = self.pool.pinned_model
                return (pinned.network if pinned else None), None
            started = time.perf_counter()
            try:
                self.model(None)
            except (StyleUnavailable, UnknownStyle) as exc:
                return None, str(exc)
            self._choose(min(warmup_size or 128, 256))
            loaded = self.pool.pinned_model
            assert loaded is not None
            if warmup_size > 0:
                self.forward(loaded.runner, np.zeros((warmup_size, warmup_size, 3), np.uint8))
            _give_back_memory(loaded.runner)
            self.prepared = True
            log.info("flask_animegan: style %r loaded (%s%s) and warmed up in %.2f s",
                     self.default_style, self.serving(loaded), self._describe_choice(),
                     time.perf_counter() - started)
            return loaded.network, None

    def candidates(self) -> list[Choice]:
        """Every backend and precision ``auto`` may choose from here."""
        available = self.backends  # opening them settles self.choice
        requested = self.requested_backend
        backends = (list(available) if requested == "auto"
                    else [requested] if requested in available else [self.choice.backend])
        found = []
        for name in backends:
            backend: Backend = self.backends[name]
            precisions = (backend.precisions() if self.requested_precision == "auto"
                          else (self.requested_precision,))
            if self.requested_precision == "int8" and "int8" not in backend.precisions():
                continue  # torch, or OpenVINO without NNCF
            found += [Choice(name, precision) for precision in precisions]
        return found

    def _choose(self, side: int) -> None:
        """Settle ``auto``: the fastest candidate that passes the fidelity guard."""
        candidates = self.candidates()
        default = self.style(None)
        assert default.path is not None
        if self.requested_precision == "int8" and not candidates:
            from .backends.int8 import missing

            why = ("OpenVINO is not available" if "openvino" not in self.backends
                   else missing() or "no backend offers it")
            log.warning("flask_animegan: ANIMEGAN_PRECISION=int8, but %s; using %s fp32",
                        why, self.choice.backend)
            self.rejected = {f"{self.choice.backend} int8": why}
            return
        if candidates == [self.choice]:
            return
        pinned = self.pool.pinned_model
        assert pinned is not None
        loaded = {}
        for choice in candidates:
            if choice == self.choice:
                loaded[choice] = pinned
                continue
            # torch converts its network in place, so it gets its own copy
            reuse = self.choice == REFERENCE and choice.backend != "torch"
            network = pinned.network if reuse else load_generator(default.path)
            loaded[choice] = self._loaded(default.path, network, choice)
        usable = {choice: style for choice, style in loaded.items() if style.note is None}
        self.rejected = {str(choice): style.note for choice, style in loaded.items()
                         if style.note is not None}
        if self.requested_precision == "int8":
            # explicit INT8: each style has its own guard, failing ones serve fp32 (_loaded)
            self.choice = candidates[0]
            self.pool.replace_pinned(loaded[self.choice])
            return
        if not usable:  # every candidate refused: the reference serves
            usable = {REFERENCE: self._loaded(default.path, load_generator(default.path),
                                              REFERENCE)}
        if len(usable) > 1:
            order, self.timings = fastest({str(c): s.runner for c, s in usable.items()}, side)
            self.choice = next(c for c in usable if str(c) == order[0])
        else:
            self.choice = next(iter(usable))
        self.pool.replace_pinned(usable[self.choice])

    def _describe_choice(self) -> str:
        timed = ", ".join(f"{name} {seconds:.3f} s" for name, seconds in self.timings.items())
        refused = "".join(f"; refused {name}: {why}" for name, why in self.rejected.items())
        return (f"; auto timed {timed}" if timed else "") + refused

    @staticmethod
    def serving(loaded: LoadedStyle) -> str:
        """``openvino fp32`` for a loaded style."""
        return f"{loaded.runner.backend} {loaded.runner.precision}"

    # -- running -------------------------------------------------------------------
    @property
    def precision(self) -> str:
        return self.choice.precision

    @property
    def backend(self) -> str:
        return self.choice.backend

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the torch networks: the precision's with torch, else float32."""
        return DTYPES[self.precision] if self.backend == "torch" else torch.float32

    @property
    def precision_timings(self) -> dict[str, float]:
        """Seconds per torch precision that ``auto`` timed (an older /healthz field)."""
        torch_only = {name.split()[1]: seconds for name, seconds in self.timings.items()
                      if name.startswith("torch ")}
        return torch_only if len(torch_only) > 1 else {}

    def run(self, image: Image.Image, style: str | None = None, *, tiled: bool = False,
            progress: TileProgress | None = None,
            on_busy: Callable[[], None] | None = None) -> Image.Image:
        """Convert an RGB image with ``style``, waiting for the gate; ``tiled`` runs the
        torch network in overlapping tiles, in bounded memory, taking the gate one tile at
        a time behind the conversions waiting (``progress``: tiles done; ``on_busy``: called
        while the gate stays busy, then the tile is tried again)."""
        chosen = self.style(style)
        pixels = np.array(image.convert("RGB") if image.mode != "RGB" else image, np.uint8)
        with self.gate.slot(behind=tiled):
            # loading (and checking) a style runs inferences too: one at a time
            loaded = self.pool.get(chosen)
            if not tiled:
                result = to_pixels(self.forward(loaded.runner, pixels))
        if tiled:
            result = run_tiled(cast(Generator, loaded.network), pixels, progress=progress,
                               each=functools.partial(self._tile_slot, on_busy))
        self._release_when_idle(loaded.runner)
        if result is None:
            # never return (or cache) what broken weights make of a photo
            raise StyleUnavailable(self.pool.mark_broken(
                chosen, f"{chosen.path}: the network's output is not finite (NaN or inf)"))
        return Image.fromarray(result)

    @contextlib.contextmanager
    def _tile_slot(self, on_busy: Callable[[], None] | None) -> Iterator[None]:
        """The gate for one tile, behind the conversions waiting; while it stays busy,
        ``on_busy()`` (it may raise) and again."""
        with contextlib.ExitStack() as stack:
            while True:
                try:
                    stack.enter_context(self.gate.slot(behind=True))
                    break
                except Overloaded:
                    if on_busy is None:
                        raise
                    on_busy()
            yield

    def _release_when_idle(self, runner: Runner) -> None:
        """Give OpenVINO's buffers back once no conversion has run for IDLE_RELEASE_S."""
        if not hasattr(runner, "release_memory"):
            return
        with self._release_lock:
            if self._release_timer is not None:
                self._release_timer.cancel()
            self._release_timer = threading.Timer(IDLE_RELEASE_S, self._release_now)
            self._release_timer.daemon = True
            self._release_timer.start()

    def _release_now(self) -> None:
        try:
            with self.gate.slot():  # never while a conversion runs
                for loaded in self.pool.loaded_styles().values():
                    _give_back_memory(loaded.runner)
        except Overloaded:
            pass  # busy after all: the next idle moment will do

    def forward(self, runner: Runner, pixels: np.ndarray) -> np.ndarray:
        """Run ``runner`` on uint8 pixels padded to MIN_SIDE, then cropped back; returns
        float32 (H, W, 3) in about [-1, 1]."""
        height, width = pixels.shape[:2]
        pad_h, pad_w = max(0, MIN_SIDE - height), max(0, MIN_SIDE - width)
        if pad_h or pad_w:
            pixels = np.pad(pixels, ((0, pad_h), (0, pad_w), (0, 0)), mode="edge")
        out = runner(pixels)
        return out[:height, :width] if out.shape[:2] != (height, width) else out

    def status(self) -> dict[str, Any]:
        loaded = self.pool.loaded_styles()
        openvino = cast("OpenVINOBackend | None", self.backends.get("openvino"))
        return {
            "default_style": self.default_style,
            "installed": sorted(self.registry.installed),
            "loaded": self.pool.loaded,
            "broken": self.pool.broken(),
            "torch_threads": torch.get_num_threads(),
            "torch_interop_threads": torch.get_num_interop_threads(),
            "backend": self.backend,
            "precision": self.precision,
            "backend_requested": self.requested_backend,
            "backends_available": list(self.backends),
            "backends_missing": dict(self._missing_backends),
            "backend_timings": self.timings,
            "backends_refused": self.rejected,
            "precision_timings": self.precision_timings,
            "styles_backend": {name: self.serving(style) for name, style in loaded.items()},
            "fidelity_db": {name: style.fidelity_db for name, style in loaded.items()
                            if style.fidelity_db is not None},
            "fidelity_notes": {name: style.note for name, style in loaded.items() if style.note},
            **({"openvino": openvino.status()} if openvino is not None else {}),
            **self.gate.status(),
        }


def _give_back_memory(runner: Runner) -> None:
    """Return the warm-up's OpenVINO buffers and torch heap to the system (worker RSS)."""
    release = getattr(runner, "release_memory", None)
    if release is not None:
        release()  # a no-op while another app of this process runs the same model
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def model_cache_dir(settings: Settings) -> Path | None:
    """ANIMEGAN_MODEL_CACHE_DIR as a folder: unset -> the user's cache folder, empty -> None."""
    if settings.model_cache_dir is None:
        return default_cache_dir()
    return Path(settings.model_cache_dir) if settings.model_cache_dir else None
