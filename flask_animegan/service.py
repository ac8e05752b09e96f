"""The per-app conversion service stored in ``app.extensions["animegan"]``."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import current_app, render_template
from flask_limiter import Limiter
from PIL import Image

from .cache import NearDuplicateCache
from .config import SPARE_READERS, Settings
from .convert.converter import Conversion, Converter
from .convert.request import ConvertRequest, Sizes, parse_request
from .convert.route import route
from .errors import ConversionError, Overloaded
from .inputs.decoding import fit
from .inputs.media import MediaInfo
from .jobs.work import Jobs
from .metrics import Metrics
from .outputs.stills import encode
from .runtime.admission import Admission
from .runtime.engine import InferenceEngine
from .storage.pages import ResultStore

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

__all__ = ["AnimeGANService", "Conversion", "admitted_at_once", "get_service", "warm_up_all"]

#: The photo of the style picker's samples (public domain: scikit-image's ``data.astronaut``).
SAMPLE_PHOTO = Path(__file__).resolve().parent / "static" / "sample-photo.jpg"
log = logging.getLogger("flask_animegan")
#: Seconds a client is told to wait while the model is still loading.
WARMING_RETRY_AFTER = 5
#: Seconds a process exiting while it warms up waits for the warm-up: exiting under the
#: network's threads aborts (SIGABRT). Under gunicorn's graceful timeout.
WARM_UP_EXIT_WAIT = 30.0
#: Every service made in this process, for gunicorn's post_worker_init (warm_up_all).
_services: weakref.WeakSet[AnimeGANService] = weakref.WeakSet()


class AnimeGANService:
    """Everything one app needs to convert photos: engine, pipeline, stores, limits.
    ``counting_limiter`` answers which ``Limiter`` counts conversions (the host's, else ours)."""

    def __init__(self, settings: Settings, engine: InferenceEngine, converter: Converter,
                 cache: NearDuplicateCache, results: ResultStore,
                 counting_limiter: Callable[[], Limiter], own_limiter: Limiter | None,
                 metrics: Metrics | None = None, jobs: Jobs | None = None,
                 render_template: Callable[..., str] = render_template) -> None:
        self.settings = settings
        self.engine = engine
        self.converter = converter
        self.decoder = converter.decoder
        self.cache = cache
        self.results = results
        self.metrics = metrics
        self.jobs = jobs  # animations and videos (jobs/work.py); None: made without them
        #: renders every page (ANIMEGAN_RENDER_TEMPLATE): Flask's, or the site's theme manager's
        self.render_template = render_template
        self.sizes = Sizes(default=settings.max_side,
                           photo=settings.max_output_side or settings.max_side,
                           media=settings.max_side, default_format=settings.output_format)
        #: the web conversions in the app at once: one running and ANIMEGAN_MAX_QUEUE more
        self.admission = Admission(1 + settings.max_queue, engine.gate.retry_after,
                                   SPARE_READERS)
        self._counting_limiter = counting_limiter
        self.own_limiter = own_limiter
        #: the default style's torch network once warmed up (None before, or if unusable)
        self.model: nn.Module | None = None
        self._samples: dict[str, bytes] = {}
        self._samples_lock = threading.Lock()
        self._warm_lock = threading.Lock()
        self.warmed_up = False
        self.warming = False  # warm_up_in_background is running
        #: how the site's administrator runs the CLI group (init_app: cli.site_command)
        self.cli_command = "flask animegan"
        _services.add(self)

    @property
    def limiter(self) -> Limiter:
        """The Limiter that counts conversions now: the host app's, else our own."""
        return self._counting_limiter()

    @property
    def rate_limit_headers(self) -> bool:
        """Whether our views add the X-RateLimit-* headers: only when our own Limiter counts."""
        return self.own_limiter is not None and self.limiter is self.own_limiter

    # -- getting ready -------------------------------------------------------------
    def warm_up(self) -> None:
        """Load the default style, settle its precision, run the warm-up inference and make
        the style samples, so that the first request is as fast as the next ones."""
        with self._warm_lock:
            if self.warmed_up:
                return
            self.decoder.start()
            if self.cache.enabled and self.cache.near:  # its pHash imports SciPy: not at a request
                self.cache.fingerprint(Image.new("RGB", (32, 32)))
            model, problem = self.engine.prepare(self.settings.warmup_size)
            self.model = model
            if model is None:
                log.warning("flask_animegan: the default style is not usable, conversions "
                            "will answer 503: %s", problem)
            else:
                self.make_samples()
            self.warmed_up = True

    # -- converting ----------------------------------------------------------------
    def parse(self, params: Any, media: bool = False) -> ConvertRequest:
        """The request ``params`` (a mapping of strings) ask for, checked before any decode."""
        return parse_request(params, self.engine, self.sizes, media=media)

    def route(self, data: bytes, request: ConvertRequest | None = None) -> MediaInfo | None:
        """The probe of an animation, a video or (at ``request``) a photo that runs in tiles:
        a job; or None for a photo converted now."""
        probe = self.jobs.probe if self.jobs is not None else None
        if request is None or not self.converter.may_tile(request):
            return route(data, probe)
        asked = request

        def tiles(info: MediaInfo) -> int:
            return self.converter.tiles_for((info.width, info.height), asked)

        return route(data, probe, tiles)

    def convert(self, image: Image.Image, style: str | None = None,
                size: int | None = None, colors: str | None = None,
                portrait: str | None = None, strength: int | None = None) -> Image.Image:
        """Convert a PIL image (any mode) with ``style`` at long side ``size``, with the
        options ``colors``, ``portrait`` and ``strength``; no cache."""
        request = self.parse({"style": style, "size": size, "colors": colors,
                              "portrait": portrait, "strength": strength})
        self._ready()
        return self.converter.image(image, request)

    def convert_upload(self, data: bytes, request: ConvertRequest | None = None,
                       client: str | None = None, **params: Any) -> Conversion:
        """Decode an uploaded file, convert it (or reuse a cached result), encode it;
        ``params`` stand for ``request``, ``client`` is the cache scope key."""
        if request is None:
            params["format"] = params.pop("fmt", None)
            request = self.parse(params)
        self._ready()
        scope = client if self.settings.cache_scope == "client" else None
        return self.converter.photo(data, request, scope=scope)

    def warm_up_in_background(self) -> threading.Thread:
        """Warm up in a thread of its own while the server answers: meanwhile conversions
        get 503 with Retry-After at once and ``/healthz`` says ``warming``, so a load
        balancer sends the traffic elsewhere."""
        self.warming = True

        def run() -> None:
            try:
                self.warm_up()
            except Exception:  # noqa: BLE001 - logged; /healthz then says no_model
                log.exception("flask_animegan: warming up failed; conversions will answer 503")
                self.model = None
                self.warmed_up = True
            finally:
                self.warming = False

        thread = threading.Thread(target=run, name="animegan-warm-up", daemon=True)
        thread.start()
        atexit.register(thread.join, WARM_UP_EXIT_WAIT)
        return thread

    def _ready(self) -> None:
        self._refuse_while_warming()
        if not self.warmed_up:
            self.warm_up()

    def _refuse_while_warming(self) -> None:
        if self.warming and not self.warmed_up:
            raise Overloaded("this server is still loading its model; try again in "
                             f"{WARMING_RETRY_AFTER} s", WARMING_RETRY_AFTER)

    def style_sample(self, name: str) -> bytes:
        """A small JPEG of the bundled sample photo in style ``name`` (made once, then kept)."""
        self._refuse_while_warming()
        return self._sample(name)

    def _sample(self, name: str) -> bytes:
        sample = self._samples.get(name)
        if sample is None:
            chosen = self.engine.style(name)
            with Image.open(SAMPLE_PHOTO) as photo:
                rgb = photo.convert("RGB")
            side = self.settings.sample_size
            target = fit(rgb, side, square=chosen.face).size
            # twice the size, then scaled down: converting a thumbnail smears the lines
            styled = self.converter.stylize(fit(rgb, 2 * side, square=chosen.face), chosen.name,
                                            "off")
            small = styled.resize(target, Image.Resampling.LANCZOS)
            sample = encode(small, "jpeg", 85, self.converter.label(chosen))
            with self._samples_lock:
                self._samples[chosen.name] = sample
        return sample

    def make_samples(self) -> None:
        """Make every installed style's sample now, skipping broken styles."""
        if not self.settings.sample_size:
            return
        for name in self.engine.styles:
            try:
                self._sample(name)
            except ConversionError:
                pass

    # -- describing ----------------------------------------------------------------
    def styles_info(self) -> list[dict[str, Any]]:
        """Installed and pullable styles, for the page and ``GET /styles``."""
        installed = self.engine.styles
        broken = self.engine.pool.broken()
        catalog = self.engine.catalog
        infos = []
        for name in sorted(set(installed) | set(catalog)):
            info = installed.get(name) or catalog[name]
            infos.append({
                "name": name,
                "installed": name in installed,
                "default": name == self.engine.default_style,
                "usable": name in installed and name not in broken,
                "face_crop": info.face,
                "licence": info.licence,
                "licence_url": info.licence_url,
                "licence_note": info.licence_note,
                "description": info.description,
                **({"error": broken[name]} if name in broken else {}),
            })
        return infos

    def storage_status(self) -> dict[str, Any]:
        """Each store a request touches (``cache``, ``pages``, ``rate_limit``) with ``ok`` and
        ``state`` (``ok``, ``down``, ``full``), after one ping per Redis."""
        stores: dict[str, Any] = {}
        for name, storage in (("cache", self.cache.storage), ("pages", self.results.storage)):
            if storage.backend != "memory":
                storage.ping()
            stores[name] = storage.status()
        if self.settings.rate_limit:
            stores["rate_limit"] = self._counts_status()
        return {"ok": all(store.get("ok", True) for store in stores.values()), **stores}

    def _counts_status(self) -> dict[str, Any]:
        counts = self.limiter.storage
        report = getattr(counts, "status", None)  # web/limits.py's FallbackCounts
        if callable(report):
            counts.check()  # one ping, as for the other stores
            return dict(report())
        try:  # memory://, or a host Limiter's storage (limits' public check)
            ok = bool(counts.check())
        except Exception:  # noqa: BLE001 - a storage that cannot say is not healthy
            ok = False
        return {"backend": type(counts).__name__, "ok": ok, "state": "ok" if ok else "down"}

    @staticmethod
    def _store_problems(storage: dict[str, Any]) -> list[str]:
        """One line per store that degrades the service, naming it and why."""
        problems = []
        for name, store in storage.items():
            if not isinstance(store, dict) or store.get("ok", True):
                continue
            where = store.get("server", store.get("backend", "?"))
            problems.append(
                f"{name}: {where} is full (maxmemory reached), writes refused"
                if store.get("state") == "full" else
                f"{name}: {where} is unreachable ({store.get('error')})")
        return problems

    def health(self, details: bool = True) -> dict[str, Any]:
        """``{"status": ...}`` (ok, degraded, warming, no_model); with ``details``, the
        engine's state and ``problems``: the broken styles and stores, and why."""
        engine = self.engine.status()
        storage = self.storage_status()
        default = engine["default_style"]
        if self.warming and not self.warmed_up:
            status = "warming"
        elif default not in engine["installed"] or default in engine["broken"]:
            status = "no_model"
        elif engine["broken"] or not storage["ok"]:
            status = "degraded"
        else:
            status = "ok"
        jobs = self.jobs.status() if self.jobs is not None else None
        if status == "ok" and jobs is not None and (not jobs["ok"] or jobs["no_worker"]):
            status = "degraded"  # still 200: the instance converts photos
        if not details:
            return {"status": status}
        problems = [f"style {name} is broken" for name in engine["broken"]]
        problems += self._store_problems(storage)
        if jobs is not None and not jobs["ok"]:
            problems.append(f"jobs: the job queue's Redis is unreachable ({jobs.get('error')})")
        if jobs is not None and jobs["no_worker"]:
            problems.append(f"jobs: {jobs['queued']} waiting, the oldest for "
                            f"{jobs['oldest_queued_s']:.0f} s, and no worker beat within "
                            f"{jobs['worker_timeout_s']} s: start `flask animegan worker`")
        return {"status": status, "pid": os.getpid(), **engine, "storage": storage,
                "problems": problems, "jobs": jobs,
                "cache": self.cache.stats(), "decoder": self.decoder.status(),
                "admission": self.admission.status()}


def get_service() -> AnimeGANService:
    """The current app's AnimeGAN service; explains the fix when the extension is missing."""
    try:
        service: AnimeGANService = current_app.extensions["animegan"]
    except KeyError:
        raise RuntimeError("flask_animegan is not initialised on this app: did you forget "
                           "AnimeGAN(app) or animegan.init_app(app)?") from None
    return service


def admitted_at_once() -> int:
    """Request threads every AnimeGAN app of this process lets its web conversions and
    their arriving uploads hold at once."""
    return sum(service.admission.threads for service in list(_services))


def warm_up_all(background: bool = False) -> list[threading.Thread]:
    """Warm up every AnimeGAN app made in this process (gunicorn.conf.py's post_worker_init),
    now, or with ``background`` in threads of their own (returned) while the server answers."""
    if not background:
        for service in list(_services):
            service.warm_up()
        return []
    return [service.warm_up_in_background() for service in list(_services)]
