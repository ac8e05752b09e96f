"""Every ``ANIMEGAN_*`` key, once: :class:`Settings` (the app's) and :class:`ServerSettings`
(gunicorn's), their checks, the old names (:data:`ALIASES`) and the groups derived from them.
A field ``max_side`` is the key ``ANIMEGAN_MAX_SIDE``."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypedDict

PREFIX = "ANIMEGAN_"
OUTPUT_FORMATS = ("jpeg", "png", "webp")
PRECISIONS = ("auto", "fp32", "bf16", "int8")
#: What can run the network (ANIMEGAN_BACKEND also takes ``auto``).
BACKENDS = ("torch", "openvino")
CACHE_SCOPES = ("client", "global")
ISOLATIONS = ("process", "thread")
HEALTH_DETAILS = ("local", "all", "none")
#: Where jobs wait and run (ANIMEGAN_JOB_QUEUE).
JOB_QUEUES = ("auto", "rq", "local")
#: URI schemes of a Redis server, for the cache and result pages (and their limiter).
REDIS_SCHEMES = ("redis", "rediss", "unix")
STORAGE_SCHEMES = ("memory", *REDIS_SCHEMES)
GiB = 1 << 30
HOUR, DAY = 3600, 86400

# -- constants: former settings no deployment had a reason to change (docs: why) ------
#: ``hash_size`` of the cache's perceptual hash (256 bits); another would orphan every entry.
PHASH_SIZE = 16
#: Portrait mode leaves faces with a smaller box side (in pixels) to the scene style.
PORTRAIT_MIN_FACE = 48
#: The least long side of the copy portrait mode searches for faces (docs/portrait.md).
PORTRAIT_DETECT_SIDE = 1024
#: Largest ratio of an upload's long side to its short side (a strip inflates memory).
MAX_ASPECT_RATIO = 20.0
#: Most scans a JPEG may have: a progressive JPEG is decoded once per scan.
MAX_JPEG_SCANS = 32
#: Seconds one decode may take in its helper process before it is killed.
DECODE_TIMEOUT = 5.0
#: An upload's body may take this many seconds, plus one per UPLOAD_MIN_RATE bytes it has
#: sent; a slower one is cut with 408, so that trickling clients give their threads back.
UPLOAD_GRACE_SECONDS = 10.0
#: Bytes per second an upload must average after UPLOAD_GRACE_SECONDS (a slow mobile link).
UPLOAD_MIN_RATE = 8 * 1024
#: Uploads that may be arriving at once beyond one per admitted conversion: the threads
#: slow clients may hold (each for UPLOAD_GRACE_SECONDS at most) without blocking the rest.
SPARE_READERS = 4
#: Peak memory of one inference run on the whole picture, per megapixel (torch fp32, the
#: most the backends take; measured in docs/large-photos.md).
WHOLE_MIB_PER_MEGAPIXEL = 1300
#: Most memory one whole-picture inference may take: a larger ANIMEGAN_MAX_SIDE is refused
#: at start (larger sizes run in tiles, ANIMEGAN_MAX_OUTPUT_SIDE).
WHOLE_PICTURE_BUDGET_MIB = 2048
#: The largest ANIMEGAN_MAX_SIDE whose square picture fits WHOLE_PICTURE_BUDGET_MIB.
WHOLE_SIDE_LIMIT = math.isqrt(WHOLE_PICTURE_BUDGET_MIB * 10**6 // WHOLE_MIB_PER_MEGAPIXEL)
#: Highest frame rate of an animation or video (the frames are bounded by ANIMEGAN_MAX_FRAMES).
MAX_FPS = 60.0
#: Largest area of one frame of an animation or video (frames are fitted to ANIMEGAN_MAX_SIDE).
MAX_FRAME_PIXELS = 4_000_000
#: A job counts against ANIMEGAN_RATE_LIMIT as ceil(frames / this) conversions.
FRAMES_PER_CONVERSION = 25
#: Seconds between two reports of a job's worker while it converts (between frames).
JOB_REPORT_SECONDS = 0.5
#: A running job whose worker has not reported for this long is taken for dead.
JOB_STALL_SECONDS = 40 * JOB_REPORT_SECONDS
#: Most seconds between two heartbeats of a job worker (a third of
#: ANIMEGAN_JOB_WORKER_TIMEOUT when that is shorter, one at least).
JOB_WORKER_BEAT_SECONDS = 10
#: A job may run this many seconds per frame it may have (ANIMEGAN_MAX_FRAMES).
JOB_SECONDS_PER_FRAME = 3
#: gunicorn's worker timeout and graceful timeout (its --timeout, --graceful-timeout win).
WORKER_TIMEOUT, GRACEFUL_TIMEOUT = 120, 60

#: A check beyond type and range: None when usable, else the problem and its fix.
Check = Callable[[Any], "str | None"]


class SettingError(ValueError):
    """A setting that cannot be used; ``key`` is its name, the message says the fix."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _setting(default: Any, kind: type, meaning: str, *, low: float | None = None,
             high: float | None = None, choices: tuple[str, ...] = (),
             check: Check | None = None) -> Any:
    """A field of :class:`Settings` with its type, meaning and allowed values (``low`` to
    ``high``, ``choices`` or a ``check``); a default of None means it may be unset."""
    metadata = {"kind": kind, "meaning": meaning, "low": low, "high": high,
                "choices": choices, "check": check}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default),
                                 metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# -- checks of single values (each returns None or the fix) ------------------------------
def _not_empty(value: str) -> str | None:
    """a string, not empty"""
    return "is empty: give a value, or leave the key out for the default" if not value else None


_URL_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)*/?")


def _url_prefix(value: str) -> str | None:
    """a path starting with `/`, of letters, digits and `-._~` between single slashes"""
    if not value.startswith("/"):
        return "must start with '/', e.g. '/animegan'"
    if not _URL_PATH.fullmatch(value) or {".", ".."} & set(value.split("/")):
        # '//host' in a link is another site; '?', '#' or a space end or break the path
        return ("must be a plain path, e.g. '/animegan' or '/tools/anime': letters, digits "
                "and -._~ between single slashes (no '//', '?', '#', spaces, '.' or '..')")
    return None


def _header_value(value: str) -> str | None:
    """one line of printable ASCII (a header's value), or empty"""
    if all(" " <= char <= "~" or char == "\t" for char in value):
        return None
    # a newline would fail every response (500), a character outside ASCII too, or worse
    return ("must be one line of printable ASCII (a header's value): no line breaks, and "
            "plain quotes ('self', not a typographic \u2019self\u2019)")


def _rate_limit(value: str) -> str | None:
    """a flask-limiter limit, e.g. `5 per minute` or `5/minute;100/day`; empty: off"""
    if value == "":
        return None  # documented: empty disables the limit
    # flask-limiter's own parser: a limit it cannot parse would be skipped, i.e. no limit
    from limits import parse_many

    try:
        items = parse_many(value)
    except ValueError as exc:
        return (f"is not a rate limit flask-limiter can parse ({exc}): write e.g. "
                "'5 per minute' or '5/minute;100/day', or '' to turn the limit off")
    if any(item.amount < 1 for item in items):
        return "allows no conversion at all: give at least 1, or '' to turn the limit off"
    if _ZERO_WINDOW.search(value):
        # flask-limiter reads "5 per 0 minutes" as 5 per minute: not what was written
        return ("has a window of 0 (flask-limiter would read it as 1): write e.g. "
                "'5 per minute' or '5 per 10 minutes'")
    return None


_ZERO_WINDOW = re.compile(r"(?:/|\bper\b)\s*0+\s*[a-z]", re.IGNORECASE)


def uri_scheme(uri: str) -> str:
    """The scheme of a URI, lower case (``redis`` of ``redis://host``); '' without one."""
    return uri.split("://", 1)[0].lower() if "://" in uri else ""


def is_redis(uri: str) -> bool:
    """Whether ``uri`` names a Redis server (``redis://``, ``rediss://``, ``unix://``)."""
    return uri_scheme(uri) in REDIS_SCHEMES


def _storage_uri(value: str) -> str | None:
    """`memory://`, `redis://`, `rediss://` or `unix://` URI"""
    if uri_scheme(value) in STORAGE_SCHEMES:
        return None
    return ("is not a storage URI: use memory:// or redis://host:6379/0 "
            f"(schemes: {', '.join(s + '://' for s in STORAGE_SCHEMES)})")


def _state_storage_uri(value: str) -> str | None:
    """a storage URI (`memory://`, `redis://...`)"""
    if value == "" or _storage_uri(value) is None:  # empty (an empty variable) is unset
        return None
    return ("is not a storage URI: use redis://host:6380/0 (a Redis with noeviction, "
            "deploy/redis-state.conf) or memory://, or leave it unset for ANIMEGAN_STORAGE_URI")


def _http_url(value: str) -> str | None:
    """an `http(s)://` URL"""
    if value == "" or (uri_scheme(value) in ("http", "https") and value.split("://", 1)[1]):
        return None
    return "is not an http(s) URL: give e.g. 'https://mirror.example/weights', or unset it"


def _extra_styles(value: dict[str, Any]) -> str | None:
    """a mapping of style name to a dict with `url` and `sha1`"""
    for name, spec in value.items():
        if not isinstance(name, str) or not isinstance(spec, Mapping):
            return (f"has the entry {name!r}: {type(spec).__name__}; give a mapping of style "
                    'name to a dict, e.g. {"mine": {"url": "https://...", "sha1": "<40 hex>"}}')
    return None  # names, urls and hashes: runtime.catalog.known_styles, also in init_app


#: An SPDX licence identifier (`MIT`, `CC-BY-4.0`, `LicenseRef-...`) or `own`.
LICENCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+\-]{0,99}")


def _licence_ids(value: list[Any]) -> str | None:
    """a list of SPDX licence identifiers or `own`, e.g. `["MIT", "CC-BY-4.0", "own"]`"""
    if not value:
        return ("allows no licence, so no style could serve: list at least one, e.g. "
                '["MIT", "own"], or unset it to allow every licence')
    for entry in value:
        if isinstance(entry, str) and entry.upper() in ("AND", "OR", "WITH"):
            return ("holds an SPDX expression: list each licence on its own, e.g. "
                    '["MIT", "Apache-2.0"] for "MIT OR Apache-2.0"')
        if not isinstance(entry, str) or not LICENCE_ID.fullmatch(entry):
            return (f"has the entry {entry!r}: give SPDX licence identifiers "
                    '(https://spdx.org/licenses/) or "own", e.g. ["MIT", "CC-BY-4.0", "own"]')
    return None


class Hook:
    """The kind of a setting that names a callable of the site, or its dotted path."""


def _dotted(value: Any) -> bool:
    parts = value.replace(":", ".").split(".") if isinstance(value, str) else []
    return len(parts) > 1 and all(part.isidentifier() for part in parts)


def _hook(value: Any) -> str | None:
    """a callable, or its dotted path (`site.auth.is_admin`)"""
    if callable(value) or _dotted(value):
        return None
    return ("is neither a callable nor the dotted path of one: give e.g. "
            "'site.auth.is_admin' or the function itself")


def _decorators(value: list[Any]) -> str | None:
    """a list of decorators, or their dotted paths (`flask_login.login_required`)"""
    for entry in value:
        if not (callable(entry) or _dotted(entry)):
            return (f"has the entry {entry!r}: give a list of view decorators or their "
                    "dotted paths, e.g. ['flask_login.login_required']")
    return None


def _block_name(value: str) -> str | None:
    """a Jinja block name"""
    if value.isidentifier():
        return None
    return "must be the name of a block of your layout, e.g. 'content'"


def available_cpus() -> int:
    """CPUs this process may run on (honours taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    """The extension's settings for one app, read once from ``app.config`` and checked;
    each field is one row of the registry."""

    models_dir: str = _setting(
        'models', str,
        'Folder holding style weights (`NAME.pt`); relative paths are resolved against '
        "the app's root path.",
        check=_not_empty)
    shipped_styles: bool = _setting(
        True, bool,
        'Also serve the styles shipped inside the package (`toon_demo`); false: only '
        'ANIMEGAN_MODELS_DIR.')
    default_style: str | None = _setting(
        None, str,
        'Style used when a request names none; unset: `paprika` or `face_paint_512_v2` if '
        "installed, else the first of the models folder, else `toon_demo` (docs/styles.md).")
    portrait_scene_style: str | None = _setting(
        None, str,
        'Portrait mode: the style of the whole picture, onto which the faces converted '
        'with the face style are pasted back; unset: the default style.',
        check=_not_empty)
    portrait_max_faces: int = _setting(
        8, int,
        'Portrait mode: the most faces converted in one picture (the largest ones).',
        low=1, high=64)
    url_prefix: str = _setting(
        '/animegan', str,
        "URL prefix of the blueprint; `/` mounts it at the site's root.",
        check=_url_prefix)
    max_side: int = _setting(
        512, int,
        'Default long side of the output, in pixels, and the largest the network runs '
        'on in one piece.',
        low=16, high=WHOLE_SIDE_LIMIT)
    max_output_side: int | None = _setting(
        None, int,
        'Largest long side a photo may ask for; unset: ANIMEGAN_MAX_SIDE. Larger sizes run '
        'in tiles, as jobs with progress, and cost more of the rate limit '
        '(docs/large-photos.md).',
        low=16, high=16384)
    max_upload_bytes: int = _setting(
        16 * 1024 * 1024, int,
        'Largest accepted request body; larger bodies get 413 before they are read.',
        low=1, high=4 * GiB)
    max_pixels: int = _setting(
        40000000, int,
        'Largest image area (width x height), read from the header before decoding.',
        low=1, high=10**9)
    max_decode_bytes: int = _setting(
        256 * 1024 * 1024, int,
        "Largest memory one decode may need at its peak, estimated from the header before "
        "decoding (docs/http-api.md); larger images get 413.",
        low=1, high=64 * GiB)
    decode_isolation: str = _setting(
        'process', str,
        f'`process`: decode uploads in helper processes with a memory limit and a '
        f'{DECODE_TIMEOUT:g} s timeout; `thread`: in the server process, without them.',
        choices=ISOLATIONS)
    rate_limit: str = _setting(
        '20 per minute', str,
        'flask-limiter limit for the upload and convert routes, per client (see '
        'ANIMEGAN_RATE_LIMIT_KEY), counted in conversions (docs/http-api.md); empty disables it.',
        check=_rate_limit)
    rate_limit_key: Any = _setting(
        None, Hook,
        "A callable (or its dotted path) naming who a request comes from, for the rate limit "
        "and the cache's scope, e.g. the logged-in user; unset: the client address.",
        check=_hook)
    storage_uri: str = _setting(
        'memory://', str,
        'Where the result cache (and, by default, the state) lives: `memory://` (this '
        'process) or `redis://host:port/db` (shared by every instance; docs/deployment.md).',
        check=_storage_uri)
    state_storage_uri: str | None = _setting(
        None, str,
        'Where the rate-limit counts, result pages and jobs live; unset: ANIMEGAN_STORAGE_URI. '
        'Several instances: a Redis with `noeviction` (docs/deployment.md).',
        check=_state_storage_uri)
    trusted_proxies: int = _setting(
        0, int,
        'Reverse proxies in front of the app that append to X-Forwarded-For (they must be '
        'the only way in); 0: ignore the header.',
        low=0, high=32)
    cache_scope: str = _setting(
        'client', str,
        'Who shares cached results: `client` (requests from the same client, as the rate '
        'limit keys them) or `global` (every client, which reveals that someone converted '
        'the same photo).',
        choices=CACHE_SCOPES)
    cache_ttl: int = _setting(
        3600, int,
        'Seconds a cached result lives; 0 disables the cache.',
        low=0, high=30 * DAY)
    cache_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the in-memory result cache (least recently used evicted first); '
        '0: no cache in memory.',
        low=0, high=64 * GiB)
    phash_max_distance: int = _setting(
        6, int,
        f'Largest Hamming distance between two {PHASH_SIZE ** 2}-bit perceptual hashes that '
        'may share a result (docs/http-api.md).',
        low=0, high=PHASH_SIZE ** 2)
    result_ttl: int = _setting(
        3600, int,
        "Seconds a result stays available: a form upload's result page, a job's record, "
        'result and preview.',
        low=60, high=30 * DAY)
    result_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the stored result pages (oldest unused evicted first).',
        low=1, high=64 * GiB)
    torch_threads: int | None = _setting(
        None, int,
        'torch intra-op threads; unset: the CPUs this process may run on.',
        low=1, high=1024)
    precision: str = _setting(
        'auto', str,
        'Inference precision: `auto` (time each this CPU can run at startup and keep the '
        'fastest faithful one), `fp32`, `bf16` or `int8` (OpenVINO; docs/benchmark.md).',
        choices=PRECISIONS)
    backend: str = _setting(
        'auto', str,
        'What runs the network: `auto` (time torch and, if installed, OpenVINO at startup '
        'and keep the fastest faithful one), `torch` or `openvino`.',
        choices=("auto", *BACKENDS))
    model_cache_dir: str | None = _setting(
        None, str,
        "Folder for OpenVINO's converted and compiled styles; unset: "
        '`$XDG_CACHE_HOME/flask-animegan`; empty: no cache.')
    max_queue: int = _setting(
        2, int,
        'Conversions allowed to wait while one runs; more get 503 with Retry-After.',
        low=0, high=1024)
    queue_timeout: float = _setting(
        60.0, float,
        'Seconds a queued conversion waits for the model before giving up with 503.',
        low=0.01, high=HOUR)
    job_queue: str = _setting(
        'auto', str,
        'Where animation and video jobs run: `rq` (on the state Redis, by `flask animegan '
        'worker` processes), `local` (a thread per app process) or `auto` (`rq` with Redis).',
        choices=JOB_QUEUES)
    job_max_queue: int = _setting(
        16, int,
        'Jobs allowed to wait for a worker; more get 503 with Retry-After.',
        low=1, high=100000)
    job_worker_timeout: int = _setting(
        60, int,
        'Seconds without a heartbeat after which a job worker counts as gone: waiting jobs '
        'then say so, `/healthz` says `degraded`, and a job it took is queued again.',
        low=3, high=HOUR)
    jobs_per_client: int = _setting(
        2, int,
        'Unfinished jobs (queued or running) one client may have; more get 429.',
        low=1, high=1000)
    max_frames: int = _setting(
        18000, int,
        'Most frames one animation or video may have (five minutes at 60 frames a '
        'second); more get 413.',
        low=1, high=1000000)
    max_seconds: float = _setting(
        300.0, float,
        'Longest duration of one animation or video, in seconds; longer gets 413. A video '
        'converts in segments, in memory that does not grow with its length '
        '(docs/benchmark.md); its frames still count against ANIMEGAN_RATE_LIMIT.',
        low=0.1, high=DAY)
    output_format: str = _setting(
        'jpeg', str,
        'Default output format: jpeg, png or webp.',
        choices=OUTPUT_FORMATS)
    jpeg_quality: int = _setting(
        90, int,
        'JPEG and WebP quality of the output.',
        low=1, high=100)
    content_labels: bool = _setting(
        True, bool,
        'Write into every result that it is AI-generated (IPTC digital source type), its '
        'style and licence, the software (docs/labels.md); false only where your own '
        'pipeline strips metadata and labels the results elsewhere.')
    c2pa_cert: str | None = _setting(
        None, str,
        'Path of a PEM certificate chain (the signing certificate first) that signs a C2PA '
        'manifest into every result; with ANIMEGAN_C2PA_KEY (docs/labels.md).',
        check=_not_empty)
    c2pa_key: str | None = _setting(
        None, str,
        "Path of the PEM private key of ANIMEGAN_C2PA_CERT's first certificate.",
        check=_not_empty)
    max_loaded_styles: int = _setting(
        3, int,
        'How many styles stay loaded in memory (LRU); the default style always does.',
        low=1, high=64)
    warmup_size: int = _setting(
        256, int,
        'Side of the square image of the warm-up inference; 0 skips it.',
        low=0, high=8192)
    weights_base_url: str | None = _setting(
        None, str,
        'Mirror to download official styles from instead of GitHub '
        '(`{base}/{name}.pt`); the pinned hashes still apply.',
        check=_http_url)
    extra_styles: dict[str, dict[str, Any]] = _setting(
        {}, dict,
        'Extra pullable styles: name to a dict with `url`, `sha1` (git blob SHA-1) and '
        'optionally `licence` (an SPDX id), `licence_note`, `description`, `face`.',
        check=_extra_styles)
    allowed_licences: list[str] | None = _setting(
        None, list,
        'The style licences this site serves, pulls and exports: SPDX identifiers or `own` '
        '(weights you put into the models folder); unset: every licence (docs/styles.md).',
        check=_licence_ids)
    health_details: str = _setting(
        'local', str,
        'Who sees the details in `{prefix}/healthz` (styles, queue, cache, errors): '
        '`local` (clients on loopback), `all` or `none`; others get only the status.',
        choices=HEALTH_DETAILS)
    content_security_policy: str = _setting(
        "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'", str,
        "Content-Security-Policy header of the blueprint's responses; empty leaves it out. "
        'Not sent by default under your own layout (docs/site-integration.md).',
        check=_header_value)
    csrf: bool = _setting(
        True, bool,
        "A CSRF token on the upload form (needs `SECRET_KEY`); Flask-WTF's `CSRFProtect`, "
        'if the app has it, is used instead.')
    page_decorators: list[Any] = _setting(
        [], list,
        'View decorators (or their dotted paths) that guard the pages, e.g. '
        '`["flask_login.login_required"]` (docs/site-integration.md).',
        check=_decorators)
    api_decorators: list[Any] = _setting(
        [], list,
        'View decorators (or their dotted paths) that guard the JSON/image API; a redirect '
        'they answer becomes a 401 JSON error.',
        check=_decorators)
    admin_check: Any = _setting(
        None, Hook,
        "A callable (or its dotted path) that says whether the visitor runs the site and may "
        "see the administrator's hints; unset: debug mode on loopback.",
        check=_hook)
    sample_size: int = _setting(
        128, int,
        "Long side of the samples in the page's style picker; 0: no samples.",
        low=0, high=1024)
    metrics: bool = _setting(
        False, bool,
        'Serve Prometheus metrics at `{prefix}/metrics` (needs `prometheus_client`); '
        'restrict who can reach that path.')
    base_template: str = _setting(
        'animegan/base.html', str,
        "Template the pages extend; point it at your site's layout, and set "
        'ANIMEGAN_CONTENT_BLOCK to its content block.',
        check=_not_empty)
    content_block: str = _setting(
        'animegan_content', str,
        'Block of ANIMEGAN_BASE_TEMPLATE that the pages fill, e.g. `content` for a '
        "site's layout; the built-in base template's is `animegan_content`.",
        check=_block_name)
    render_template: Any = _setting(
        'flask.render_template', Hook,
        'A callable (or its dotted path) that renders every page, called like '
        '`flask.render_template(name, **context)`; a themed site gives its theme manager\'s '
        '(docs/integration.md).',
        check=_hook)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Read and check every ``ANIMEGAN_*`` key (missing ones take their defaults)."""
        settings = cls(**{setting.field: config[setting.name] for setting in SETTINGS
                          if setting.name in config})
        settings.validate()
        return settings

    # -- derived values ---------------------------------------------------------
    @property
    def threads(self) -> int:
        """torch intra-op threads: the configured value, else the usable CPUs."""
        return self.torch_threads or available_cpus()

    @property
    def decoders(self) -> int:
        """Uploads decoded at once: one per CPU this process may run on."""
        return available_cpus()

    @property
    def state_storage(self) -> str:
        """Where counts, result pages and jobs live: their own URI, else the shared storage."""
        return self.state_storage_uri or self.storage_uri

    @property
    def job_queue_kind(self) -> str:
        """``rq`` or ``local``: ANIMEGAN_JOB_QUEUE with ``auto`` resolved from the storage."""
        if self.job_queue != "auto":
            return self.job_queue
        return "rq" if is_redis(self.state_storage) else "local"

    @property
    def job_worker_beat(self) -> int:
        """Seconds between two heartbeats of a job worker: a third of its timeout, so one
        missed beat is no death (JOB_WORKER_BEAT_SECONDS at most, a second at least)."""
        return max(1, min(JOB_WORKER_BEAT_SECONDS, self.job_worker_timeout // 3))

    @property
    def job_timeout(self) -> int:
        """Seconds one job may run: JOB_SECONDS_PER_FRAME for each frame it may have."""
        return JOB_SECONDS_PER_FRAME * self.max_frames

    # -- checks ----------------------------------------------------------------
    def validate(self) -> None:
        """Check every value, then the rules between settings (:class:`SettingError`)."""
        if isinstance(self.max_side, int) and self.max_side > WHOLE_SIDE_LIMIT:
            # before the range check: this message names the tiled alternative
            whole_mib = self.max_side ** 2 / 1e6 * WHOLE_MIB_PER_MEGAPIXEL
            raise SettingError("ANIMEGAN_MAX_SIDE", (
                f"ANIMEGAN_MAX_SIDE={self.max_side} runs the network on pictures up to "
                f"{self.max_side}×{self.max_side} in one piece, which needs about "
                f"{whole_mib / 1024:.1f} GiB ({WHOLE_MIB_PER_MEGAPIXEL} MiB per megapixel), "
                f"over the budget of {WHOLE_PICTURE_BUDGET_MIB} MiB: set ANIMEGAN_MAX_SIDE "
                f"to {WHOLE_SIDE_LIMIT} or less, and ANIMEGAN_MAX_OUTPUT_SIDE={self.max_side} "
                "to serve larger sizes in tiles (docs/large-photos.md)"))
        for setting in SETTINGS:
            setting.checked(getattr(self, setting.field))
        if self.max_output_side is not None and self.max_output_side < self.max_side:
            raise SettingError("ANIMEGAN_MAX_OUTPUT_SIDE", (
                f"ANIMEGAN_MAX_OUTPUT_SIDE={self.max_output_side} is under ANIMEGAN_MAX_SIDE="
                f"{self.max_side}, the default size: raise it, or leave it unset for "
                "ANIMEGAN_MAX_SIDE"))
        if self.precision == "int8" and self.backend == "torch":
            raise SettingError("ANIMEGAN_PRECISION", (
                "ANIMEGAN_PRECISION=int8 runs on OpenVINO only, but ANIMEGAN_BACKEND=torch: "
                "set ANIMEGAN_BACKEND to openvino or auto, or ANIMEGAN_PRECISION to auto, "
                "fp32 or bf16"))
        if (self.c2pa_cert is None) != (self.c2pa_key is None):
            given, missing = (("ANIMEGAN_C2PA_CERT", "ANIMEGAN_C2PA_KEY")
                              if self.c2pa_key is None else
                              ("ANIMEGAN_C2PA_KEY", "ANIMEGAN_C2PA_CERT"))
            raise SettingError(missing, (
                f"{given} is set but {missing} is not: a C2PA manifest needs both the "
                "certificate chain and its key; set both, or neither"))
        if self.c2pa_cert is not None and not self.content_labels:
            raise SettingError("ANIMEGAN_CONTENT_LABELS", (
                "ANIMEGAN_CONTENT_LABELS is off, but ANIMEGAN_C2PA_CERT asks for signed "
                "labels: turn the labels on, or unset ANIMEGAN_C2PA_CERT and ANIMEGAN_C2PA_KEY"))
        if (self.content_block != DEFAULTS["ANIMEGAN_CONTENT_BLOCK"]
                and self.base_template == DEFAULTS["ANIMEGAN_BASE_TEMPLATE"]):
            raise SettingError("ANIMEGAN_CONTENT_BLOCK", (
                "ANIMEGAN_CONTENT_BLOCK names a block of your layout: set "
                "ANIMEGAN_BASE_TEMPLATE to that layout too, e.g. 'layout.html'"))


class AnimeGANOptions(TypedDict, total=False):
    """The keyword options of ``AnimeGAN(app, **options)``, typed for editors and mypy
    (tests/test_settings.py keeps them equal to the fields of :class:`Settings`)."""

    models_dir: str
    shipped_styles: bool
    default_style: str | None
    portrait_scene_style: str | None
    portrait_max_faces: int
    url_prefix: str
    max_side: int
    max_output_side: int | None
    max_upload_bytes: int
    max_pixels: int
    max_decode_bytes: int
    decode_isolation: str
    rate_limit: str
    rate_limit_key: Any
    storage_uri: str
    state_storage_uri: str | None
    trusted_proxies: int
    cache_scope: str
    cache_ttl: int
    cache_max_bytes: int
    phash_max_distance: int
    result_ttl: int
    result_max_bytes: int
    torch_threads: int | None
    precision: str
    backend: str
    model_cache_dir: str | None
    max_queue: int
    queue_timeout: float
    job_queue: str
    job_max_queue: int
    job_worker_timeout: int
    jobs_per_client: int
    max_frames: int
    max_seconds: float
    output_format: str
    jpeg_quality: int
    content_labels: bool
    c2pa_cert: str | None
    c2pa_key: str | None
    max_loaded_styles: int
    warmup_size: int
    weights_base_url: str | None
    extra_styles: dict[str, dict[str, Any]]
    allowed_licences: list[str] | None
    health_details: str
    content_security_policy: str
    csrf: bool
    page_decorators: list[Any]
    api_decorators: list[Any]
    admin_check: Any
    sample_size: int
    metrics: bool
    base_template: str
    content_block: str
    render_template: Any


_KIND_WORDS = {int: "a whole number", float: "a number", bool: "True or False",
               str: "a string", dict: "a mapping (a dict)", list: "a list",
               Hook: "a callable or its dotted path"}


@dataclass(frozen=True)
class Setting:
    """One row of the registry and of the configuration table."""

    name: str
    default: Any
    meaning: str
    kind: type = str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    check: Check | None = None

    @property
    def field(self) -> str:
        return self.name[len(PREFIX):].lower()

    @property
    def optional(self) -> bool:
        return self.default is None

    def allowed(self) -> str:
        """The values this setting takes, in words (the configuration table's column)."""
        if self.choices:
            words = "one of " + ", ".join(f"`{c}`" for c in self.choices)
        elif self.low is not None and self.high is not None:
            low, high = (self._number(self.low), self._number(self.high))
            words = f"{_KIND_WORDS[self.kind]} from {low} to {high}"
        elif self.check is not None and self.check.__doc__:
            words = self.check.__doc__.splitlines()[0]
        else:
            words = _KIND_WORDS[self.kind]
        return words + (", or unset" if self.optional else "")

    def _number(self, value: float) -> str:
        if self.name.endswith("_BYTES") and value >= GiB and value % GiB == 0:
            return f"{int(value) // GiB} GiB"
        return f"{value:g}" if isinstance(value, float) else str(value)

    def example(self) -> Any:
        """A usable value, for error messages: the default, else the lowest allowed."""
        if self.default is not None:
            return self.default
        if self.low is not None:
            return self.kind(self.low)
        return "..."

    def checked(self, value: Any) -> Any:
        """``value`` if this setting can use it, else :class:`SettingError`."""
        if value is None and self.optional:
            return None
        if not _is_kind(value, self.kind):
            hint = ""
            if isinstance(value, str):
                hint = (" (a string from the environment: pass it through "
                        "flask_animegan.config.from_environ, or write it without quotes)")
            raise self.error(value, f"is {type(value).__name__}, not {_KIND_WORDS[self.kind]}"
                                    f"{hint}; give e.g. {self.example()!r}"
                                    + (" or None (unset)" if self.optional else ""))
        if self.kind in (int, float) and not self._in_range(value):
            raise self.error(value, f"is out of range: give {self.allowed()}; the default "
                                    f"is {self.default!r}")
        if self.choices and value not in self.choices:
            raise self.error(value, f"is not one of {', '.join(self.choices)}: give one of "
                                    f"them (the default is {self.default!r})")
        if self.check is not None:
            problem = self.check(value)
            if problem is not None:
                raise self.error(value, problem)
        return value

    def _in_range(self, value: float) -> bool:
        return (math.isfinite(value) and (self.low is None or value >= self.low)
                and (self.high is None or value <= self.high))

    def error(self, value: Any, problem: str, source: str = "") -> SettingError:
        return SettingError(self.name, f"{source}{self.name}={_shown(value)} {problem}")


def _is_kind(value: Any, kind: type) -> bool:
    if kind is Hook:
        return callable(value) or isinstance(value, str)
    if kind is list:
        return isinstance(value, (list, tuple))
    if kind is float:  # a whole number is a number; True is not
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _rows(settings_class: type) -> tuple[Setting, ...]:
    return tuple(
        Setting(PREFIX + f.name.upper(),
                f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
                f.metadata["meaning"], f.metadata["kind"], f.metadata["low"], f.metadata["high"],
                f.metadata["choices"], f.metadata["check"])
        for f in dataclasses.fields(settings_class))


@dataclass(frozen=True)
class ServerSettings:
    """What ``gunicorn.conf.py`` reads from the environment (never ``app.config``)."""

    server_threads: int | None = _setting(
        None, int,
        'gunicorn request threads per worker (`--threads` wins); unset: 2 × (ANIMEGAN_MAX_QUEUE '
        '+ 1) + 5, '
        'the fewest a worker starts with.',
        low=1, high=1024)
    access_log: str = _setting(
        '-', str,
        'gunicorn access log file (`-`: stdout; empty: none).')
    control_socket: str = _setting(
        '', str,
        "Path of this instance's gunicorn control socket (`gunicornc`); empty: none.")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        """The server settings in ``environ`` (default: ``os.environ``), checked."""
        values = _read_environ(environ, SERVER_SETTINGS)
        return cls(**{name[len(PREFIX):].lower(): value for name, value in values.items()})


SETTINGS: tuple[Setting, ...] = _rows(Settings)
SERVER_SETTINGS: tuple[Setting, ...] = _rows(ServerSettings)
#: Every ANIMEGAN_* name, the app's and gunicorn.conf.py's: the one registry.
REGISTRY: tuple[Setting, ...] = SETTINGS + SERVER_SETTINGS
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
_BY_NAME = {s.name: s for s in SETTINGS}


# -- old names ----------------------------------------------------------------------------
class RemovedSettingWarning(FutureWarning):
    """An old setting name, still read for one release (a FutureWarning: shown by default)."""


@dataclass(frozen=True)
class Alias:
    """An old name: its ``new`` name, else the ``fix``; ``gunicorn``: the setting it gives."""

    new: str | None = None
    fix: str = ""
    gunicorn: str | None = None

    def message(self, old: str) -> str:
        if self.new:
            return f"{old} is now {self.new}: rename the key (its value is used for {self.new})"
        return f"{old} is no longer a setting: {self.fix}"

    @property
    def server(self) -> bool:
        """Whether gunicorn.conf.py reads it (else the app does)."""
        return self.gunicorn is not None or self.new in {s.name for s in SERVER_SETTINGS}


def _constant(value: Any) -> Alias:
    return Alias(fix=f"now a constant: {value}, remove the key")


def _flag(flag: str, setting: str) -> Alias:
    return Alias(fix=f"pass gunicorn's {flag} (or GUNICORN_CMD_ARGS='{flag}=...'); its value "
                     "is still used in this release", gunicorn=setting)


#: Every removed or merged name and what replaces it: the one table of old names.
ALIASES: dict[str, Alias] = {
    "ANIMEGAN_THREADS": Alias("ANIMEGAN_SERVER_THREADS"),  # taken for ANIMEGAN_TORCH_THREADS
    "ANIMEGAN_RATELIMIT_STORAGE_URI": Alias("ANIMEGAN_STATE_STORAGE_URI"),
    "ANIMEGAN_RESULT_STORAGE_URI": Alias("ANIMEGAN_STATE_STORAGE_URI"),
    "ANIMEGAN_JOB_TTL": Alias("ANIMEGAN_RESULT_TTL"),
    "ANIMEGAN_PHASH_SIZE": _constant(PHASH_SIZE),
    "ANIMEGAN_PORTRAIT_MIN_FACE": _constant(PORTRAIT_MIN_FACE),
    "ANIMEGAN_MAX_ASPECT_RATIO": _constant(MAX_ASPECT_RATIO),
    "ANIMEGAN_MAX_JPEG_SCANS": _constant(MAX_JPEG_SCANS),
    "ANIMEGAN_DECODE_TIMEOUT": _constant(DECODE_TIMEOUT),
    "ANIMEGAN_MAX_FPS": _constant(MAX_FPS),
    "ANIMEGAN_MAX_FRAME_PIXELS": _constant(MAX_FRAME_PIXELS),
    "ANIMEGAN_FRAMES_PER_CONVERSION": _constant(FRAMES_PER_CONVERSION),
    "ANIMEGAN_JOB_STALL_SECONDS": _constant(JOB_STALL_SECONDS),
    "ANIMEGAN_PAD_MULTIPLE": Alias(fix="removed: pictures go to the network as they are, "
                                       "remove the key"),
    "ANIMEGAN_DECODE_SLOTS": Alias(fix="now one per CPU this process may run on, remove the key"),
    "ANIMEGAN_JOB_TIMEOUT": Alias(fix=f"now {JOB_SECONDS_PER_FRAME} s per frame of "
                                      "ANIMEGAN_MAX_FRAMES, remove the key"),
    "ANIMEGAN_BIND": _flag("--bind", "bind"),
    "ANIMEGAN_WORKERS": _flag("--workers", "workers"),
    "ANIMEGAN_WORKER_TIMEOUT": _flag("--timeout", "timeout"),
    "ANIMEGAN_GRACEFUL_TIMEOUT": _flag("--graceful-timeout", "graceful_timeout"),
    "ANIMEGAN_LOG_LEVEL": _flag("--log-level", "loglevel"),
}


def apply_aliases(config: MutableMapping[str, Any], *, server: bool = False) -> dict[str, Any]:
    """Take the old names out of ``config``, each with a warning, giving a renamed one's value
    to its new key if unset. Returns the old names' values by gunicorn setting."""
    gunicorn: dict[str, Any] = {}
    for old, alias in ALIASES.items():
        if old not in config or alias.server != server:
            continue
        value = config.pop(old)
        warnings.warn(alias.message(old), RemovedSettingWarning, stacklevel=3)
        if alias.new:
            if isinstance(value, str) and value.startswith("redis+unix://"):
                value = value.removeprefix("redis+")  # flask-limiter's spelling of unix://
            config.setdefault(alias.new, value)
        elif alias.gunicorn:
            gunicorn[alias.gunicorn] = value
    return gunicorn


def unknown_keys(config: Mapping[str, Any]) -> dict[str, str | None]:
    """``ANIMEGAN_*`` keys of ``config`` that are no setting of the app, each with the
    closest setting's name (a likely typo) or None (gunicorn's are no typo: no guess)."""
    server = {s.name for s in SERVER_SETTINGS}
    return {key: None if key in server else
            next(iter(difflib.get_close_matches(key, _BY_NAME, n=1)), None)
            for key in config if key.startswith(PREFIX) and key not in _BY_NAME}


def from_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The app's ANIMEGAN_* settings in ``environ`` (default: ``os.environ``), converted and
    checked; an empty variable unsets an optional setting and turns a switch off."""
    return _read_environ(environ, SETTINGS)


def gunicorn_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """gunicorn settings that old names (``ANIMEGAN_BIND``...) still give, with a warning."""
    found = {key: value for key, value in (os.environ if environ is None else environ).items()
             if ALIASES.get(key, Alias()).gunicorn}
    return apply_aliases(found, server=True)


def _read_environ(environ: Mapping[str, str] | None,
                  registry: tuple[Setting, ...]) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    raw = {key: value for key, value in environ.items()
           if key.startswith(PREFIX) and key in ALIASES and not ALIASES[key].gunicorn}
    apply_aliases(raw, server=registry is SERVER_SETTINGS)
    raw.update({s.name: environ[s.name] for s in registry if s.name in environ})
    return {s.name: _from_text(s, raw[s.name]) for s in registry if s.name in raw}


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_ENV = "environment variable "


def _from_text(setting: Setting, raw: str) -> Any:
    if setting.kind is Hook and raw.strip() == "":
        return setting.default  # an empty variable: unset, i.e. the default
    if setting.kind in (str, Hook):
        value: Any = raw
    elif setting.kind is list and raw.strip() == "" and setting.optional:
        return None  # an empty variable: unset
    elif setting.kind is list and raw.lstrip().startswith("["):  # a JSON array
        try:
            value = json.loads(raw)
        except ValueError:
            raise setting.error(raw, 'is not a JSON array: write e.g. ["MIT", "own"], or the '
                                     "entries separated by commas", _ENV) from None
    elif setting.kind is list:  # entries separated by commas or spaces
        value = raw.replace(",", " ").split()
    elif setting.kind is bool:
        word = raw.strip().lower()
        if word not in _TRUE and word not in _FALSE:
            raise setting.error(raw, f"must be one of {', '.join(_TRUE)} or "
                                     f"{', '.join(_FALSE[:-1])}", _ENV)
        value = word in _TRUE
    elif raw.strip() == "" and setting.optional:
        return None  # an empty variable means "use the automatic choice"
    elif setting.kind is dict:
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise setting.error(raw, 'must be a JSON object, e.g. {"mystyle": {"url": '
                                     '"https://...", "sha1": "<40 hex>"}}', _ENV)
    else:
        try:
            value = setting.kind(raw.strip())
        except ValueError:
            raise setting.error(raw, f"is not {_KIND_WORDS[setting.kind]}; unset it or "
                                     f"give e.g. {setting.example()!r}", _ENV) from None
    try:
        return setting.checked(value)
    except SettingError as exc:
        raise SettingError(setting.name, _ENV + str(exc)) from None


# -- derived groups: built once from Settings and handed to the parts -----------------------
@dataclass(frozen=True)
class DecodeLimits:
    """What one decode of an upload may cost (inputs/)."""

    max_pixels: int = 40_000_000
    max_bytes: int = 256 * 1024 * 1024
    max_aspect: float = MAX_ASPECT_RATIO
    max_scans: int = MAX_JPEG_SCANS


@dataclass(frozen=True)
class MediaLimits:
    """What one animation or video may hold."""

    max_frames: int = 18000
    max_seconds: float = 300.0
    max_fps: float = MAX_FPS
    max_pixels: int = MAX_FRAME_PIXELS  # per frame
    max_total_pixels: int = 18000 * MAX_FRAME_PIXELS  # frames times pixels a frame


@dataclass(frozen=True)
class PortraitLimits:
    """Portrait mode: the scene's style (None: the default style) and which faces count."""

    scene_style: str | None = None
    min_face: int = PORTRAIT_MIN_FACE
    max_faces: int = 8
    #: faces are searched on a copy with at least this long side (never upscaled), so that
    #: a small output finds the faces a large one does; min_face counts in its pixels
    detect_side: int = PORTRAIT_DETECT_SIDE


@dataclass(frozen=True)
class StorageURIs:
    """Where the cache and the state (counts, result pages, jobs) live; ``limiter`` is the
    state in flask-limiter's spelling, ``state_key`` the setting that gave it."""

    cache: str = "memory://"
    state: str = "memory://"
    limiter: str = "memory://"
    state_key: str = "ANIMEGAN_STORAGE_URI"


@dataclass(frozen=True)
class Derived:
    """Every derived group of one app's settings, built once in ``init_app``."""

    decode: DecodeLimits
    media: MediaLimits
    portrait: PortraitLimits
    storage: StorageURIs

    @classmethod
    def from_settings(cls, settings: Settings) -> Derived:
        state = settings.state_storage
        return cls(
            DecodeLimits(max_pixels=settings.max_pixels, max_bytes=settings.max_decode_bytes),
            # the total: every frame at its largest
            MediaLimits(max_frames=settings.max_frames, max_seconds=settings.max_seconds,
                        max_total_pixels=settings.max_frames * MAX_FRAME_PIXELS),
            PortraitLimits(scene_style=settings.portrait_scene_style,
                           max_faces=settings.portrait_max_faces),
            # flask-limiter spells unix:// redis+unix://
            StorageURIs(cache=settings.storage_uri, state=state,
                        limiter="redis+" + state if uri_scheme(state) == "unix" else state,
                        state_key=("ANIMEGAN_STATE_STORAGE_URI" if settings.state_storage_uri
                                   else "ANIMEGAN_STORAGE_URI")))
