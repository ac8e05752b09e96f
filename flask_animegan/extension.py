"""The Flask extension object: ``AnimeGAN(app)`` or ``AnimeGAN()`` + ``init_app(app)``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from flask import Flask
from flask_limiter import Limiter

from . import cli as _cli  # noqa: F401  registers `flask animegan ...` on the blueprint
from . import config as settings
from .cache import NearDuplicateCache, ResultStore
from .catalog import known_styles
from .clients import client_address
from .decoders import Decoder
from .decoding import DecodeLimits
from .engine import InferenceEngine, configure_torch_threads
from .metrics import Metrics
from .service import AnimeGANService, get_service
from .views import LIMITED_ENDPOINTS, blueprint, routing_error_response

EXTENSION_KEY = "animegan"
#: The package logs here (the startup line, one line per conversion); gunicorn.conf.py
#: sends it to gunicorn's error log.
log = logging.getLogger("flask_animegan")


class AnimeGAN:
    """Adds photo-to-anime conversion to a Flask app.

    Keyword options are defaults for the ``ANIMEGAN_*`` settings, given without the
    prefix and in lower case (``AnimeGAN(app, max_side=384)``); values already in
    ``app.config`` win. Per-app state lives in ``app.extensions["animegan"]``, so
    one ``AnimeGAN`` object can serve several apps.
    """

    def __init__(self, app: Flask | None = None, **options: Any) -> None:
        unknown = {f"ANIMEGAN_{k.upper()}" for k in options} - set(settings.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown AnimeGAN options: {', '.join(sorted(unknown))}; see "
                            "flask_animegan.config.SETTINGS for the valid names")
        self._options = {f"ANIMEGAN_{k.upper()}": v for k, v in options.items()}
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Configure ``app``, load the default style, warm it up and register the routes."""
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError("AnimeGAN is already initialised on this app; call "
                               "init_app once per app")
        for key, default in settings.DEFAULTS.items():
            app.config.setdefault(key, self._options.get(key, default))
        cfg = app.config
        try:
            settings.validate(cfg)
            catalog = known_styles(cfg["ANIMEGAN_EXTRA_STYLES"])
        except ValueError as exc:
            raise RuntimeError(f"flask_animegan configuration error: {exc}") from None

        configure_torch_threads(settings.torch_threads(cfg))
        metrics = Metrics() if cfg["ANIMEGAN_METRICS"] else None
        engine = InferenceEngine(
            models_dir=self._models_dir(app), catalog=catalog,
            default_style=cfg["ANIMEGAN_DEFAULT_STYLE"] or None,
            max_loaded=cfg["ANIMEGAN_MAX_LOADED_STYLES"], max_queue=cfg["ANIMEGAN_MAX_QUEUE"],
            queue_timeout=cfg["ANIMEGAN_QUEUE_TIMEOUT"],
            precision=cfg["ANIMEGAN_PRECISION"], events=metrics,
        )
        started = time.perf_counter()
        model, problem = engine.load_default()
        engine.choose_precision(min(cfg["ANIMEGAN_WARMUP_SIZE"] or 128, 256))
        engine.warm_up(cfg["ANIMEGAN_WARMUP_SIZE"])
        model = engine.model(None) if model is not None else None
        # the design card: the model is registered in app.config at startup
        cfg["ANIMEGAN_MODEL"] = model
        if model is None:
            log.warning("flask_animegan: the default style is not usable, conversions "
                        "will answer 503: %s", problem)
        else:
            log.info("flask_animegan: style %r loaded (%s) and warmed up in %.2f s",
                     engine.default_style, engine.precision, time.perf_counter() - started)

        ttl = cfg["ANIMEGAN_CACHE_TTL"]
        cache = NearDuplicateCache(
            max_bytes=cfg["ANIMEGAN_CACHE_MAX_BYTES"], ttl=ttl,
            hash_size=cfg["ANIMEGAN_PHASH_SIZE"], max_distance=cfg["ANIMEGAN_PHASH_MAX_DISTANCE"],
            color_tolerance=cfg["ANIMEGAN_COLOR_TOLERANCE"],
            local_tolerance=cfg["ANIMEGAN_LOCAL_TOLERANCE"],
        )
        results = ResultStore(max_bytes=cfg["ANIMEGAN_RESULT_MAX_BYTES"],
                              ttl=cfg["ANIMEGAN_RESULT_TTL"])
        decoder = Decoder(
            limits=DecodeLimits(max_pixels=cfg["ANIMEGAN_MAX_PIXELS"],
                                max_bytes=cfg["ANIMEGAN_MAX_DECODE_BYTES"],
                                max_aspect=cfg["ANIMEGAN_MAX_ASPECT_RATIO"],
                                max_scans=cfg["ANIMEGAN_MAX_JPEG_SCANS"]),
            isolation=cfg["ANIMEGAN_DECODE_ISOLATION"], timeout=cfg["ANIMEGAN_DECODE_TIMEOUT"],
            slots=settings.decode_slots(cfg), max_queue=cfg["ANIMEGAN_MAX_QUEUE"],
            queue_timeout=cfg["ANIMEGAN_QUEUE_TIMEOUT"])
        decoder.start()
        limiter = self._limiter(app)
        service = AnimeGANService(cfg, engine, cache, results, limiter, decoder, metrics)
        service.rate_limit_headers = not getattr(limiter, "_headers_enabled", False)
        service.make_samples()
        app.extensions[EXTENSION_KEY] = service
        app.register_blueprint(blueprint, url_prefix=cfg["ANIMEGAN_URL_PREFIX"])
        # Requests under the prefix that match no route (404, 405, 308) never reach the
        # blueprint's handlers; give them its headers and error bodies too.
        app.after_request(routing_error_response)
        self._apply_limits(app, limiter, cfg["ANIMEGAN_RATE_LIMIT"])

    @staticmethod
    def _models_dir(app: Flask) -> Path:
        path = Path(app.config["ANIMEGAN_MODELS_DIR"])
        return path if path.is_absolute() else Path(app.root_path) / path

    @staticmethod
    def _limiter(app: Flask) -> Limiter:
        """The host app's flask-limiter Limiter if it has one, else a new one for this app."""
        for existing in app.extensions.get("limiter", ()):
            if isinstance(existing, Limiter):
                return existing
        # Our views add the X-RateLimit-* headers (flask-limiter's would put Retry-After
        # on every response, 200s included); 429s carry Retry-After from our handler.
        return Limiter(client_address, app=app, headers_enabled=False,
                       storage_uri=(app.config["ANIMEGAN_RATELIMIT_STORAGE_URI"]
                                    or app.config["ANIMEGAN_STORAGE_URI"]))

    @staticmethod
    def _apply_limits(app: Flask, limiter: Limiter, rate: str) -> None:
        """Limit upload+convert together per client; exempt every other route of ours.

        Done on this app's view functions (not with decorators at import time) so that
        each app gets its own limiter and limit.
        """
        prefix = f"{blueprint.name}."
        for endpoint, view in list(app.view_functions.items()):
            if not endpoint.startswith(prefix):
                continue
            if endpoint in LIMITED_ENDPOINTS and rate:
                app.view_functions[endpoint] = limiter.shared_limit(
                    rate, scope="animegan-conversions")(view)
            else:
                limiter.exempt(view)

    @staticmethod
    def service() -> AnimeGANService:
        """The current app's service (same as ``current_app.extensions["animegan"]``)."""
        return get_service()
