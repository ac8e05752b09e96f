"""Loaded styles: the default one pinned, a few others kept (LRU), broken files remembered."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cachetools import LRUCache
from torch import nn

from ..errors import StyleUnavailable
from .backends.base import Runner
from .catalog import StyleInfo
from .weights import WeightsError

log = logging.getLogger("flask_animegan")


def _mtime(path: Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


class LoadEvents(Protocol):
    def model_loaded(self, style: str, seconds: float) -> None: ...


@dataclass
class LoadedStyle:
    """A style ready to run: its torch network and what runs it."""

    network: nn.Module  # the torch generator (``service.model`` for the default)
    runner: Runner
    fidelity_db: float | None = None  # PSNR against torch fp32 (None: it is torch fp32)
    note: str | None = None  # why it runs on another backend than the engine's choice


class ModelPool:
    """Loaded styles by name: ``pinned`` never evicted, ``max_loaded`` others in LRU order,
    a broken file retried only once it changed. ``loader`` raises WeightsError for a bad file."""

    def __init__(self, *, max_loaded: int, pinned: str | None,
                 loader: Callable[[StyleInfo], LoadedStyle],
                 events: LoadEvents | None = None) -> None:
        self.pinned = pinned
        self.loader = loader
        self.events = events
        self.pinned_model: LoadedStyle | None = None
        self._models: LRUCache[str, LoadedStyle] = LRUCache(maxsize=max_loaded)
        # name -> (public message, details for the log and the CLI, file mtime)
        self._broken: dict[str, tuple[str, str, float | None]] = {}
        # one load at a time; the table has its own short lock, so /healthz never waits
        self._loading = threading.Lock()
        self._table = threading.Lock()

    def get(self, style: StyleInfo) -> LoadedStyle:
        """``style`` ready to run, loading it on first use."""
        if style.name == self.pinned and self.pinned_model is not None:
            return self.pinned_model
        with self._loading:
            with self._table:
                model = self._models.get(style.name)
            if model is None and style.name == self.pinned:
                model = self.pinned_model
            if model is None:
                model = self._load(style)
                if style.name == self.pinned:
                    self.pinned_model = model
                else:
                    with self._table:
                        self._models[style.name] = model
            return model

    def _load(self, style: StyleInfo) -> LoadedStyle:
        failed = self._broken.get(style.name)
        if failed and failed[2] == _mtime(style.path):
            raise StyleUnavailable(failed[0])
        assert style.path is not None, "only installed styles are loaded"
        try:
            started = time.perf_counter()
            model = self.loader(style)
            if self.events is not None:
                self.events.model_loaded(style.name, time.perf_counter() - started)
        except WeightsError as exc:
            raise StyleUnavailable(self.mark_broken(style, str(exc))) from exc
        self._broken.pop(style.name, None)
        return model

    def replace_pinned(self, model: LoadedStyle) -> None:
        """Serve the pinned style with ``model`` from now on."""
        with self._loading, self._table:
            self.pinned_model = model
            self._models.clear()  # others reload with the engine's new choice

    def mark_broken(self, style: StyleInfo, details: str) -> str:
        """Record that ``style`` cannot serve; the public message (paths stay in the log)."""
        public = (f"style {style.name!r} is unavailable: its weights cannot be used. "
                  "The server's log says why; choose another style")
        if self._broken.get(style.name, ("", ""))[1] != details:
            log.error("flask_animegan: style %r cannot be used: %s", style.name, details)
        self._broken[style.name] = (public, details, _mtime(style.path))
        with self._table:
            self._models.pop(style.name, None)
        if style.name == self.pinned:
            self.pinned_model = None
        return public

    @property
    def loaded(self) -> list[str]:
        return list(self.loaded_styles())

    def loaded_styles(self) -> dict[str, LoadedStyle]:
        """Every loaded style by name, the pinned one first."""
        with self._table:
            found = dict(self._models.items())
        if self.pinned_model is not None and self.pinned is not None:
            found = {self.pinned: self.pinned_model, **found}
        return found

    def broken(self) -> dict[str, str]:
        """Public message per broken style."""
        return {name: public for name, (public, _, _) in self._broken.items()}

    def broken_details(self) -> dict[str, str]:
        """Why each broken style fails, with file paths: for the CLI and the log only."""
        return {name: details for name, (_, details, _) in self._broken.items()}
