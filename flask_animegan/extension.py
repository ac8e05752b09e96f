"""The Flask extension object: ``AnimeGAN(app)`` or ``AnimeGAN()`` + ``init_app(app)``."""

from __future__ import annotations

import difflib
import logging
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flask import Flask

from .cache import NearDuplicateCache
from .cli import commands as _cli  # noqa: F401  registers `flask animegan ...` on the blueprint
from .config import (
    DEFAULTS,
    AnimeGANOptions,
    Derived,
    Settings,
    StorageURIs,
    apply_aliases,
    unknown_keys,
)
from .convert.converter import Converter
from .inputs.isolation import Decoder
from .jobs.queues import open_queue
from .jobs.records import JobStore
from .jobs.work import Jobs, run_job
from .metrics import Metrics
from .outputs.labels import Labelling
from .process import configure_process
from .runtime import tiles
from .runtime.catalog import STYLE_NAME, known_styles
from .runtime.engine import InferenceEngine
from .service import AnimeGANService
from .storage import open_storage
from .storage.pages import ResultStore
from .web import jobs as _jobs  # noqa: F401  registers the job routes on the blueprint
from .web import limits as ratelimit
from .web import openapi as _openapi  # noqa: F401  registers <prefix>/openapi.json
from .web import protection
from .web.blueprint import blueprint
from .web.views import routing_error_response  # the views register their routes

if TYPE_CHECKING:  # typing.Unpack is new in Python 3.11
    from typing_extensions import Unpack
    from werkzeug.routing import Rule

EXTENSION_KEY = "animegan"
#: The package logs here (the startup line, one line per conversion); gunicorn.conf.py
#: sends it to gunicorn's error log.
log = logging.getLogger("flask_animegan")


def _check_csrf_secret(app: Flask, settings: Settings) -> None:
    """Fail closed: without a secret key the form's CSRF token would silently be left out."""
    if not settings.csrf or app.config.get("SECRET_KEY"):
        return
    if app.config.get("WTF_CSRF_SECRET_KEY") and "csrf" in app.extensions:
        return  # Flask-WTF signs its tokens with its own key
    raise ValueError(
        "ANIMEGAN_CSRF is on (the default) and the app has no SECRET_KEY, so the upload form "
        "could carry no CSRF token. Set SECRET_KEY before AnimeGAN(app) / init_app: "
        "app.config['SECRET_KEY'] = <a long random string, the same on every worker, e.g. "
        "from python -c 'import secrets; print(secrets.token_hex(32))'>, or from the "
        "environment (FLASK_SECRET_KEY with app.config.from_prefixed_env()). Only if "
        "something else protects the form, set ANIMEGAN_CSRF = False")


def _check_no_route_is_shadowed(app: Flask, prefix: str) -> None:
    """Refuse a prefix that puts one of the blueprint's routes where the app already has
    one (only routes made before ``init_app`` can be seen): one of the two would be dead."""
    ours: list[Rule] = []
    theirs: dict[str, list[Rule]] = {}
    for rule in app.url_map.iter_rules():
        if (rule.endpoint or "").startswith(f"{blueprint.name}."):
            ours.append(rule)
        else:
            theirs.setdefault(rule.rule, []).append(rule)
    for rule in ours:
        for other in theirs.get(rule.rule, ()):
            if ((rule.methods or set()) & (other.methods or set())) - {"HEAD", "OPTIONS"}:
                raise RuntimeError(
                    f"flask_animegan configuration error: ANIMEGAN_URL_PREFIX={prefix!r} "
                    f"puts {rule.rule} ({rule.endpoint}) where the app already has a route "
                    f"({other.endpoint}): give another prefix, e.g. '/animegan', or move "
                    "that route")


def _check_default_style(name: str | None, engine: InferenceEngine) -> None:
    """Refuse an ANIMEGAN_DEFAULT_STYLE neither installed nor one `flask animegan pull`
    knows (so that `pull NAME` can run with it already set), or one whose licence
    ANIMEGAN_ALLOWED_LICENCES does not allow."""
    refused = engine.registry.refused.get(name or "")
    if refused is not None:
        allowed = ", ".join(engine.registry.policy.allowed or ())
        raise RuntimeError(
            f"flask_animegan configuration error: ANIMEGAN_DEFAULT_STYLE={name!r} has the "
            f"licence {refused.licence}, which ANIMEGAN_ALLOWED_LICENCES does not allow "
            f"(allowed: {allowed}): choose a style under an allowed licence (installed: "
            f"{', '.join(sorted(engine.styles)) or 'none'}), or add {refused.licence} to "
            "ANIMEGAN_ALLOWED_LICENCES if this site may use it")
    if not name or name in engine.styles or name in engine.catalog:
        return
    known = sorted(set(engine.styles) | set(engine.catalog))
    near = difflib.get_close_matches(name.lower(), known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    if not STYLE_NAME.fullmatch(name):
        problem = ("is not a style name: names are lowercase letters, digits, '_' and '-'"
                   f"{hint}; give an installed style")
    else:
        problem = (f"is neither installed nor a style `flask animegan pull` knows{hint}; "
                   f"give an installed style, or put {name}.pt into {engine.models_dir}")
    raise RuntimeError(
        f"flask_animegan configuration error: ANIMEGAN_DEFAULT_STYLE={name!r} {problem}, "
        "or unset it for the first installed style (installed: "
        f"{', '.join(sorted(engine.styles)) or 'none'})")


def _labelling(settings: Settings) -> Labelling | None:
    """What results say about how they were made, with the C2PA signer if configured (its
    files checked now: ``SettingError``); None with the labels off, and a warning."""
    if not settings.content_labels:
        log.warning("flask_animegan: ANIMEGAN_CONTENT_LABELS is off: results carry no mark "
                    "that they are AI-generated; label them where you publish them "
                    "(docs/labels.md)")
        return None
    from .outputs.provenance import C2paSigner

    signer = None
    if settings.c2pa_cert is not None and settings.c2pa_key is not None:
        signer = C2paSigner.from_files(settings.c2pa_cert, settings.c2pa_key)
    # the package is imported already (this module is in it); importing it would be a cycle
    version = sys.modules[__package__ or "flask_animegan"].__version__
    return Labelling(f"flask-animegan {version}", signer)


class AnimeGAN:
    """Adds photo-to-anime conversion to a Flask app.

    Keyword options are defaults for the ``ANIMEGAN_*`` settings in lower case, without the
    prefix (``AnimeGAN(app, max_side=384)``); ``app.config`` wins. The model loads at warm-up
    (:meth:`warm_up`, gunicorn.conf.py) or on the first conversion, never in ``init_app``.
    """

    def __init__(self, app: Flask | None = None, **options: Unpack[AnimeGANOptions]) -> None:
        self._options = {f"ANIMEGAN_{k.upper()}": v for k, v in options.items()}
        apply_aliases(self._options)  # old names: a warning, and the new key takes the value
        unknown = set(self._options) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown AnimeGAN options: {', '.join(sorted(unknown))}; see "
                            "flask_animegan.config.Settings for the valid names")
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read and check the settings once (``RuntimeError`` names a bad key and the fix),
        make the service and register the routes, the CLI and the limits."""
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError("AnimeGAN is already initialised on this app; call "
                               "init_app once per app")
        apply_aliases(app.config)  # before the defaults, so that a renamed value counts
        for key, default in DEFAULTS.items():
            app.config.setdefault(key, self._options.get(key, default))
        unknown = unknown_keys(app.config)
        if unknown:  # a mistyped key is a setting the owner believes in force: refuse it
            key, near = sorted(unknown.items())[0]
            raise RuntimeError(f"flask_animegan configuration error: {key} is not a setting"
                               + (f"; did you mean {near}?" if near else
                                  "; remove it (the settings: docs/configuration.md)"))
        try:
            settings = Settings.from_config(app.config)
            derived = Derived.from_settings(settings)
            catalog = known_styles(settings.extra_styles)
            _check_csrf_secret(app, settings)
            protection.install(app, settings)
            render_template = protection.imported(
                "ANIMEGAN_RENDER_TEMPLATE", settings.render_template, "site.themes:render")
            own = (None if ratelimit.host_limiter(app.extensions)
                   else ratelimit.own_limiter(app, settings, derived.storage))
            job_queue = open_queue(settings, derived.storage.state, partial(self._run_job, app))
            labelling = _labelling(settings)
        except ValueError as exc:
            raise RuntimeError(f"flask_animegan configuration error: {exc}") from None

        configure_process(settings.threads)
        metrics = Metrics() if settings.metrics else None
        engine = InferenceEngine.from_settings(self._models_dir(app, settings), settings,
                                               catalog=catalog, events=metrics)
        _check_default_style(settings.default_style, engine)
        scene = settings.portrait_scene_style
        if scene is not None and scene in engine.registry.refused:
            raise RuntimeError(
                f"flask_animegan configuration error: ANIMEGAN_PORTRAIT_SCENE_STYLE={scene!r} "
                f"has the licence {engine.registry.refused[scene].licence}, which "
                "ANIMEGAN_ALLOWED_LICENCES does not allow: choose a style under an allowed "
                "licence, or unset it to paint the scene with the default style")
        if scene is not None and scene not in engine.styles:
            raise RuntimeError(
                f"flask_animegan configuration error: ANIMEGAN_PORTRAIT_SCENE_STYLE={scene!r} "
                f"is not an installed style (installed: {', '.join(sorted(engine.styles))}); "
                f"run `flask animegan pull {scene}`, put {scene}.pt into {engine.models_dir}, "
                "or unset it to paint the scene with the default style")
        decoder = Decoder.from_settings(settings, derived)
        secret = app.config.get("SECRET_KEY")
        cache, results = self._stores(settings, derived.storage, secret)
        converter = Converter(
            decoder, engine, quality=settings.jpeg_quality, cache=cache,
            # at most STATS_SIDE, the tiles' first pass would run the picture whole
            tile_above=max(settings.max_side, tiles.STATS_SIDE), portrait=derived.portrait,
            labelling=labelling)
        jobs = Jobs(settings, self._job_store(settings, derived.storage, secret), job_queue,
                    converter, convert_url=f"{settings.url_prefix.rstrip('/')}/convert")
        if metrics is not None:
            metrics.watch_jobs(jobs.status)
        service = AnimeGANService(settings, engine, converter, cache, results,
                                  partial(ratelimit.counting_limiter, app.extensions, own),
                                  own, metrics, jobs, render_template=render_template)
        service.cli_command = _cli.site_command(app)
        if settings.rate_limit:
            jobs.allowance = ratelimit.JobAllowance(lambda: service.limiter, settings.rate_limit)
        app.extensions[EXTENSION_KEY] = service
        app.register_blueprint(blueprint, url_prefix=settings.url_prefix)
        _check_no_route_is_shadowed(app, settings.url_prefix)
        # Requests under the prefix that match no route (404, 405, 308) never reach the
        # blueprint's handlers; give them its headers and error bodies too.
        app.after_request(routing_error_response)
        ratelimit.configure(own or service.limiter, keyed=settings.rate_limit_key is not None)

    @staticmethod
    def _models_dir(app: Flask, settings: Settings) -> Path:
        path = Path(settings.models_dir)
        path = path if path.is_absolute() else Path(app.root_path) / path
        # A folder that does not exist yet is fine (`flask animegan pull` makes it); a file
        # there can never hold a style.
        if path.exists() and not path.is_dir():
            raise RuntimeError(
                f"flask_animegan configuration error: ANIMEGAN_MODELS_DIR={str(path)!r} is "
                "a file, not a folder: give the folder that holds (or will hold) the "
                "NAME.pt styles")
        return path

    @staticmethod
    def _stores(settings: Settings, storage: StorageURIs,
                secret: Any) -> tuple[NearDuplicateCache, ResultStore]:
        """The result cache and the result pages; a page store on a Redis that evicts when
        full gets a warning. Cache keys hold the client's address only as a digest keyed
        with SECRET_KEY, so whoever can read Redis cannot list who converted what."""
        cache = NearDuplicateCache(
            open_storage(storage.cache, max_bytes=settings.cache_max_bytes,
                         prefix="animegan:cache:"),
            ttl=settings.cache_ttl, max_distance=settings.phash_max_distance,
            near=settings.cache_scope == "client",
            key=secret.encode() if isinstance(secret, str) else bytes(secret or b""))
        pages = open_storage(storage.state, max_bytes=settings.result_max_bytes,
                             prefix="animegan:page:")
        policy = pages.maxmemory_policy()
        if policy is not None and policy != "noeviction":
            log.warning("flask_animegan: the result pages' Redis at %s has maxmemory-policy "
                        "%s: when it fills up, other traffic (the cache's) can evict a page "
                        "before its time, and its visitor gets a 404. Keep the pages (and the "
                        "rate-limit counts) in a Redis of their own with noeviction "
                        "(deploy/redis-state.conf): ANIMEGAN_STATE_STORAGE_URI",
                        pages.status()["server"], policy)
        results = ResultStore(pages, ttl=settings.result_ttl,
                              max_bytes=settings.result_max_bytes)
        return cache, results

    @staticmethod
    def _job_store(settings: Settings, storage: StorageURIs, secret: Any) -> JobStore:
        """Jobs live where the result pages do; in memory, in a store of their own sized
        for a full queue of the largest uploads beside the results."""
        budget = (settings.result_max_bytes
                  + (settings.job_max_queue + 2) * settings.max_upload_bytes)
        state = open_storage(storage.state, max_bytes=budget, prefix="animegan:")
        key = secret.encode() if isinstance(secret, str) else bytes(secret or b"")
        return JobStore(state, ttl=settings.result_ttl, secret=key)

    @staticmethod
    def _run_job(app: Flask, job_id: str) -> None:
        """The local queue's thread runs each job in the app's context, as RQ's does."""
        with app.app_context():
            run_job(job_id)

    @staticmethod
    def warm_up(app: Flask) -> None:
        """Load ``app``'s default style and warm it up now (gunicorn.conf.py does this
        in each worker; call it yourself under another server)."""
        app.extensions[EXTENSION_KEY].warm_up()

