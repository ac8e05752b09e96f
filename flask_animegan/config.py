"""Every configuration key the extension reads: the registry, and the one check derived from it.

:class:`Settings` lists each setting once, as a field with its type, default, allowed
values (a range, choices or a check) and one line of meaning, the way Flask-Limiter's
``constants.py`` keeps its names. ``init_app`` copies the defaults into ``app.config``
(``setdefault``) and reads them back once with :meth:`Settings.from_config`, which refuses
a wrong type, a value out of range, an unknown choice or an unparsable rate limit with an
error that names the key and the fix. :func:`from_environ` converts environment strings
through the same registry (the example app and ``gunicorn.conf.py``). The configuration
table of docs/configuration.md is generated from (and tested against) :data:`SETTINGS`.
A field ``max_side`` is the key ``ANIMEGAN_MAX_SIDE``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from collections.abc import Callable, Mapping
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

#: A check beyond type and range: the value -> None when usable, else what is wrong and
#: how to fix it (completing "ANIMEGAN_X=value ...").
Check = Callable[[Any], "str | None"]


class SettingError(ValueError):
    """A setting that cannot be used; ``key`` is its name, the message says the fix."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _setting(default: Any, kind: type, meaning: str, *, low: float | None = None,
             high: float | None = None, choices: tuple[str, ...] = (),
             check: Check | None = None) -> Any:
    """A field of :class:`Settings`: its default, its type (environment values convert
    to it), its meaning (the configuration table) and what values it allows: ``low`` to
    ``high`` for numbers, ``choices`` or a ``check`` for strings. A default of None
    means the setting may be unset."""
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
    """a flask-limiter limit, e.g. `5 per minute` or `5/minute;100/day`; empty: off

    Parsed by flask-limiter's own parser (``limits.parse_many``): a limit it cannot parse
    would otherwise be skipped at every request, i.e. no limit at all."""
    if value == "":
        return None  # documented: empty disables the limit
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


def _scheme(value: str) -> str:
    return value.split("://", 1)[0].lower() if "://" in value else ""


def _storage_uri(value: str) -> str | None:
    """`memory://`, `redis://`, `rediss://` or `unix://` URI"""
    if _scheme(value) in STORAGE_SCHEMES:
        return None
    return ("is not a storage URI: use memory:// or redis://host:6379/0 "
            f"(schemes: {', '.join(s + '://' for s in STORAGE_SCHEMES)})")


def _result_storage_uri(value: str) -> str | None:
    """a storage URI (`memory://`, `redis://...`)"""
    if value == "" or _storage_uri(value) is None:  # empty (an empty variable) is unset
        return None
    return ("is not a storage URI: use redis://host:6380/0 (a Redis with noeviction, "
            "deploy/redis-state.conf) or memory://, or leave it unset for ANIMEGAN_STORAGE_URI")


def _ratelimit_storage_uri(value: str) -> str | None:
    """a flask-limiter storage URI (`memory://`, `redis://...`)"""
    # the scheme itself is checked by flask-limiter when the extension makes its Limiter
    # (web/limits.py), still in init_app; empty (an empty environment variable) is unset
    if _scheme(value) or value == "":
        return None
    return ("is not a flask-limiter storage URI: use memory:// or redis://host:6379/0 "
            "(redis+unix:///path for a socket), or leave it unset for ANIMEGAN_STORAGE_URI")


def _http_url(value: str) -> str | None:
    """an `http(s)://` URL"""
    if value == "" or (_scheme(value) in ("http", "https") and value.split("://", 1)[1]):
        return None
    return "is not an http(s) URL: give e.g. 'https://mirror.example/weights', or unset it"


def _extra_styles(value: dict[str, Any]) -> str | None:
    """a mapping of style name to a dict with `url` and `sha1`"""
    for name, spec in value.items():
        if not isinstance(name, str) or not isinstance(spec, Mapping):
            return (f"has the entry {name!r}: {type(spec).__name__}; give a mapping of style "
                    'name to a dict, e.g. {"mine": {"url": "https://...", "sha1": "<40 hex>"}}')
    return None  # names, urls and hashes: runtime.catalog.known_styles, also in init_app


class Hook:
    """The kind of a setting that names code of the site: a callable, or its dotted path
    (``"site.auth.is_admin"`` or ``"site.auth:is_admin"``), imported in ``init_app``."""


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
    """The extension's settings for one app, read once from ``app.config`` and checked.

    Each field is one row of the registry: its type (the annotation), default, allowed
    values and meaning sit side by side in its ``_setting(...)``."""

    models_dir: str = _setting(
        'models', str,
        'Folder holding style weights (`NAME.pt`); relative paths are resolved against '
        "the app's root path.",
        check=_not_empty)
    shipped_styles: bool = _setting(
        True, bool,
        'Also serve the styles shipped inside the package (`toon_demo`, a small demo '
        'style) besides those of ANIMEGAN_MODELS_DIR, where a file of the same name wins; '
        'false serves only the models folder.')
    default_style: str | None = _setting(
        None, str,
        'Style used when a request names none; unset picks the first installed of '
        "`paprika`, `face_paint_512_v2`, else the models folder's first alphabetically, "
        'else the shipped `toon_demo`. Must be installed, or an official style not pulled '
        'yet (checked at start).')
    portrait_scene_style: str | None = _setting(
        None, str,
        'Portrait mode (a face style, or `portrait=on`): the style the whole picture '
        'is converted with before the faces, converted with the face style, are pasted '
        'back; unset: the default style. Must be installed (checked at start).',
        check=_not_empty)
    portrait_min_face: int = _setting(
        48, int,
        'Portrait mode: faces smaller than this (the side of the face box, in pixels of '
        'the picture as it is converted) are left to the scene style.',
        low=16, high=4096)
    portrait_max_faces: int = _setting(
        8, int,
        'Portrait mode: at most this many faces are converted in one picture (the '
        'largest); the others are left to the scene style.',
        low=1, high=64)
    url_prefix: str = _setting(
        '/animegan', str,
        "URL prefix of the blueprint. `/` mounts it at the site's root; a prefix that "
        "puts one of its routes where the app already has one stops the app at start.",
        check=_url_prefix)
    max_side: int = _setting(
        512, int,
        'Default long side of the output, in pixels, and the largest the network runs '
        'on in one piece.',
        low=16, high=8192)
    max_output_side: int | None = _setting(
        None, int,
        'Largest long side a photo may ask for, in pixels; unset: ANIMEGAN_MAX_SIDE. '
        'Sizes above ANIMEGAN_MAX_SIDE (and above 512 px, which the tiles\' statistics '
        'pass runs whole anyway) run in overlapping tiles in bounded memory '
        '(docs/large-photos.md) and cost (size / ANIMEGAN_MAX_SIDE)^2 conversions of '
        'the rate limit, at most its whole window. Animations and videos stay within '
        'ANIMEGAN_MAX_SIDE.',
        low=16, high=16384)
    max_upload_bytes: int = _setting(
        16 * 1024 * 1024, int,
        'Largest accepted request body; larger bodies get 413 before they are read.',
        low=1, high=4 * GiB)
    max_pixels: int = _setting(
        40000000, int,
        'Largest accepted image area (width x height) read from the file header, '
        'checked before decoding; guards against decompression bombs.',
        low=1, high=10**9)
    max_decode_bytes: int = _setting(
        192 * 1024 * 1024, int,
        "Largest memory one decode may need at its peak, estimated from the header "
        "before any pixel is decoded: Pillow's storage for the mode, the decoder's own "
        "buffers (WebP canvases, a progressive JPEG's coefficients), every copy on the "
        "way to the fitted RGB image, and the metadata Pillow keeps. Larger images get 413.",
        low=1, high=64 * GiB)
    max_aspect_ratio: float = _setting(
        20.0, float,
        "Largest ratio of an upload's long side to its short side; more gets 413.",
        low=1, high=1000)
    max_jpeg_scans: int = _setting(
        32, int,
        'Most scans a JPEG may have (counted before decoding; a progressive JPEG is '
        'decoded once per scan, real ones have about 10).',
        low=1, high=1000)
    decode_isolation: str = _setting(
        'process', str,
        '`process`: decode uploads in helper processes with a memory limit, killed '
        'after ANIMEGAN_DECODE_TIMEOUT; `thread`: decode in the server process (same '
        'checks and gate, no hard limits).',
        choices=ISOLATIONS)
    decode_timeout: float = _setting(
        5.0, float,
        'Seconds one decode may take in its helper process before it is killed: 413, or 503 '
        'when the helper had under half of that in CPU time (the load, not the file, was slow).',
        low=0.01, high=HOUR)
    decode_slots: int | None = _setting(
        None, int,
        'Uploads decoded at once per process (more wait, as for the model, up to '
        'ANIMEGAN_MAX_QUEUE, else 503); unset uses the CPUs this process may run on.',
        low=1, high=1024)
    rate_limit: str = _setting(
        '5 per minute', str,
        'flask-limiter limit for the upload and convert routes, per client address; '
        'empty disables it.',
        check=_rate_limit)
    storage_uri: str = _setting(
        'memory://', str,
        'Where the result cache (and, unless ANIMEGAN_RESULT_STORAGE_URI is set, the result '
        'pages) lives: `memory://` (this process, bounded by the *_MAX_BYTES settings) or '
        '`redis://[:password@]host:port/db` / `rediss://...` (shared by every instance; '
        'bound it with Redis `maxmemory` and an LRU policy). If Redis is unreachable or '
        'full, conversions go on without the cache.',
        check=_storage_uri)
    ratelimit_storage_uri: str | None = _setting(
        None, str,
        'flask-limiter storage; unset uses ANIMEGAN_STORAGE_URI. `memory://` counts per '
        'process; with Redis, counts are shared, and fall back to per-process memory '
        'while Redis is unreachable or full. Several instances: a Redis of its own with '
        '`noeviction` (deploy/redis-state.conf), so that cache traffic never evicts a count.',
        check=_ratelimit_storage_uri)
    result_storage_uri: str | None = _setting(
        None, str,
        'Where the result pages of form uploads live; unset uses ANIMEGAN_STORAGE_URI. '
        'Several instances: the Redis of the rate-limit counts, with `noeviction`, so that '
        'cache traffic never evicts a page (deploy/redis-state.conf).',
        check=_result_storage_uri)
    trusted_proxies: int = _setting(
        0, int,
        'Reverse proxies in front of the app that append to X-Forwarded-For; the rate '
        'limit keys on the address the outermost trusted one saw (entries that are not '
        'IP addresses are ignored). They must be the only way in. 0: ignore the header.',
        low=0, high=32)
    cache_scope: str = _setting(
        'client', str,
        'Who shares cached results: `client` (default: only requests with the same '
        'rate-limit key, the client address) or `global` (every client; a result then '
        'reveals that someone converted the same photo recently).',
        choices=CACHE_SCOPES)
    cache_ttl: int = _setting(
        3600, int,
        'Seconds a cached result lives; 0 disables the cache.',
        low=0, high=30 * DAY)
    cache_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the in-memory result cache (least recently used results are evicted '
        'first); an entry holds its result and an 11 KiB fingerprint of its input, '
        'never the upload (docs/http-api.md); 0: no cache in memory.',
        low=0, high=64 * GiB)
    phash_size: int = _setting(
        16, int,
        '`hash_size` of `imagehash.phash` used as the cache key (16 gives 256 bits).',
        low=4, high=64)
    phash_max_distance: int = _setting(
        6, int,
        'Largest Hamming distance between two perceptual hashes that may share a result '
        '(the rest of the cache rule, in docs/http-api.md, must hold too).',
        low=0, high=64 * 64)
    result_ttl: int = _setting(
        3600, int,
        'Seconds the result page of a form upload (and its images) stays available.',
        low=1, high=30 * DAY)
    result_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the stored result pages (oldest unused evicted first).',
        low=1, high=64 * GiB)
    torch_threads: int | None = _setting(
        None, int,
        'torch intra-op threads; unset uses the CPUs this process may run on '
        '(`os.sched_getaffinity`).',
        low=1, high=1024)
    precision: str = _setting(
        'auto', str,
        'Inference precision: `auto` (at startup, time the default style in fp32, '
        'bf16 where this CPU computes it natively, and, with the `int8` extra, OpenVINO '
        'INT8, and keep the fastest that passes the fidelity guard), `fp32`, `bf16` or '
        '`int8` (OpenVINO with NNCF; each style is quantised once, cached like the '
        'compiled models, and served in INT8 only if it stays within 35 dB PSNR of torch '
        'fp32 at two sizes, else in OpenVINO fp32).',
        choices=PRECISIONS)
    backend: str = _setting(
        'auto', str,
        'What runs the network: `auto` (at startup, time torch and, with the `openvino` '
        'extra installed, OpenVINO in each precision ANIMEGAN_PRECISION allows on the '
        'default style, and keep the fastest whose pictures stay within 40 dB PSNR of '
        'torch fp32), `torch` or `openvino` (torch, with a warning, if the extra is '
        'missing). Each style is checked when it loads; one that fails runs on torch fp32.',
        choices=("auto", *BACKENDS))
    pad_multiple: int = _setting(
        1, int,
        'Pad each picture (reflecting its edge, at the bottom and the right) to a multiple '
        'of this many pixels before the network, and crop the result back: for CPUs whose '
        'kernels run odd sizes slowly. 1: no padding. `python -m bench.odd_sizes` times '
        'each backend as is and padded to 4, 8, 16 and 32 on this CPU, with what the '
        'padding changes (a side that is no multiple of 4 moves the contour lines by a '
        'fraction of a pixel: about 32 dB PSNR against the unpadded picture).',
        low=1, high=64)
    model_cache_dir: str | None = _setting(
        None, str,
        "Folder for OpenVINO's converted styles and compiled models, so that a restart "
        'converts and compiles nothing; unset: `$XDG_CACHE_HOME/flask-animegan` (else '
        '`~/.cache/flask-animegan`); empty: no cache. Relative to the working directory.')
    max_queue: int = _setting(
        2, int,
        'Conversions allowed to wait while one runs; more get 503 with Retry-After. '
        "Keep it below the server's thread count so the 503 can be sent.",
        low=0, high=1024)
    queue_timeout: float = _setting(
        60.0, float,
        'Seconds a queued conversion waits for the model before giving up with 503.',
        low=0.01, high=HOUR)
    job_queue: str = _setting(
        'auto', str,
        'Where jobs (animations and videos, `POST {prefix}/jobs`) wait and run: `rq` '
        '(an RQ queue on the Redis of ANIMEGAN_RESULT_STORAGE_URI, else ANIMEGAN_STORAGE_URI, '
        'converted by `flask animegan worker` processes on any machine that reaches it), '
        '`local` (one in-process worker thread per app process, one job at a time: '
        'single-machine) or `auto` (`rq` when that storage is Redis, else `local`). `rq` '
        'without a Redis storage stops the app at start.',
        choices=JOB_QUEUES)
    job_ttl: int = _setting(
        3600, int,
        "Seconds a job's record, result and preview stay available (each key has this "
        'TTL, renewed while the job runs); the upload is dropped when the job ends.',
        low=60, high=30 * DAY)
    job_max_queue: int = _setting(
        16, int,
        'Jobs allowed to wait for a worker; more get 503 with Retry-After.',
        low=1, high=100000)
    job_timeout: int = _setting(
        1800, int,
        'Seconds one job may run before it is stopped and marked failed.',
        low=10, high=DAY)
    job_stall_seconds: float = _setting(
        20.0, float,
        'A running job whose worker has not reported for this long (a killed worker) is '
        'requeued once, else marked failed; workers report at least every 0.5 s between '
        'frames, so keep it above the time of one frame.',
        low=2, high=HOUR)
    jobs_per_client: int = _setting(
        2, int,
        'Unfinished jobs (queued or running) one client may have; more get 429.',
        low=1, high=1000)
    frames_per_conversion: int = _setting(
        25, int,
        'A job counts against ANIMEGAN_RATE_LIMIT as ceil(frames / this) conversions.',
        low=1, high=100000)
    max_frames: int = _setting(
        600, int,
        'Most frames one animation or video may have (read from its header, checked again '
        'while decoding); more get 413.',
        low=1, high=1000000)
    max_seconds: float = _setting(
        30.0, float,
        'Longest duration of one animation or video, in seconds; longer gets 413.',
        low=0.1, high=DAY)
    max_fps: float = _setting(
        60.0, float,
        'Highest frame rate of one animation or video; higher gets 413.',
        low=1, high=1000)
    max_frame_pixels: int = _setting(
        4000000, int,
        'Largest area (width x height) of one frame of an animation or video; larger '
        'gets 413.',
        low=1, high=10**9)
    output_format: str = _setting(
        'jpeg', str,
        'Default output format: jpeg, png or webp.',
        choices=OUTPUT_FORMATS)
    jpeg_quality: int = _setting(
        90, int,
        'JPEG and WebP quality of the output.',
        low=1, high=100)
    max_loaded_styles: int = _setting(
        3, int,
        'How many styles stay loaded in memory (LRU); the default style always does.',
        low=1, high=64)
    warmup_size: int = _setting(
        256, int,
        'Side of the square image of the warm-up inference, run when the serving '
        "process warms up (gunicorn.conf.py's post_worker_init, or `warm_up()`); 0 "
        'skips it.',
        low=0, high=8192)
    weights_base_url: str | None = _setting(
        None, str,
        'Mirror to download official styles from instead of GitHub '
        '(`{base}/{name}.pt`); the pinned hashes still apply.',
        check=_http_url)
    extra_styles: dict[str, dict[str, Any]] = _setting(
        {}, dict,
        'Extra pullable styles: a mapping of name to a dict with `url`, `sha1` (git '
        'blob SHA-1) and optionally `licence`, `description`, `face`.',
        check=_extra_styles)
    health_details: str = _setting(
        'local', str,
        'Who sees the details in `{prefix}/healthz` (styles, queue, cache, errors): '
        '`local` (clients on loopback), `all` or `none`; others get only the status.',
        choices=HEALTH_DETAILS)
    content_security_policy: str = _setting(
        "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'", str,
        "Content-Security-Policy header of the blueprint's responses; empty leaves it out. "
        'With your own layout (ANIMEGAN_BASE_TEMPLATE), the default is not sent: your site '
        'sends its own policy (allow `blob:` images); a policy you set here is sent.',
        check=_header_value)
    csrf: bool = _setting(
        True, bool,
        "The extension's own CSRF token on the upload form (the JSON API needs none). It "
        "needs the app's `SECRET_KEY`: without one the app refuses to start. With Flask-WTF's "
        "`CSRFProtect` on the app, its token and check are used instead.")
    page_decorators: list[Any] = _setting(
        [], list,
        'View decorators (or their dotted paths) that guard the pages: the form, its '
        'results and the job page, e.g. `["flask_login.login_required"]` '
        '(docs/site-integration.md). Each checks the request and answers it (a redirect to '
        'the login page) or lets it through; `/healthz` and the static files stay open.',
        check=_decorators)
    api_decorators: list[Any] = _setting(
        [], list,
        'View decorators (or their dotted paths) that guard the JSON/image API (`/convert`, '
        '`/styles`, `/jobs`, ...; not `/healthz`, `/metrics` or `/openapi.json`). A redirect '
        'they answer becomes a 401 JSON error with its `login_url`.',
        check=_decorators)
    admin_check: Any = _setting(
        None, Hook,
        "A callable (or its dotted path) that says whether the current visitor runs the "
        "site: only then does the page show the administrator's hints (`flask animegan "
        "pull ...`). Unset: shown only in debug mode to clients on loopback.",
        check=_hook)
    sample_size: int = _setting(
        128, int,
        "Long side of the style samples in the page's style picker, converted from a "
        'bundled photo at warm-up (or on first view); 0: no samples.',
        low=0, high=1024)
    metrics: bool = _setting(
        False, bool,
        'Serve Prometheus metrics at `{prefix}/metrics` (needs `prometheus_client`; '
        'under gunicorn, `gunicorn.conf.py` turns on its multiprocess mode). Restrict '
        'who can reach that path.')
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

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Read every ``ANIMEGAN_*`` key (missing ones take their defaults) and check them
        all; :class:`SettingError` names the first unusable key and the fix."""
        settings = cls(**{setting.field: config[setting.name] for setting in SETTINGS
                          if setting.name in config})
        settings.validate()  # every value once, in the registry's order, then the rules between
        return settings

    # -- derived values ----------------------------------------------------------
    @property
    def threads(self) -> int:
        """torch intra-op threads: the configured value, else the usable CPUs."""
        return self.torch_threads or available_cpus()

    @property
    def decoders(self) -> int:
        """Uploads decoded at once: the configured value, else the usable CPUs."""
        return self.decode_slots or available_cpus()

    @property
    def ratelimit_storage(self) -> str:
        """flask-limiter's storage URI: its own setting, else the shared storage."""
        return self.ratelimit_storage_uri or self.storage_uri

    @property
    def result_storage(self) -> str:
        """Where the result pages live: their own setting, else the shared storage."""
        return self.result_storage_uri or self.storage_uri

    @property
    def job_queue_kind(self) -> str:
        """``rq`` or ``local``: ANIMEGAN_JOB_QUEUE with ``auto`` resolved from the storage."""
        if self.job_queue != "auto":
            return self.job_queue
        return "rq" if _scheme(self.result_storage) in REDIS_SCHEMES else "local"

    # -- checks ----------------------------------------------------------------
    def validate(self) -> None:
        """Check every value against the registry, then the rules between settings;
        raise :class:`SettingError` naming the key and the fix."""
        for setting in SETTINGS:
            setting.checked(getattr(self, setting.field))
        if self.phash_max_distance > self.phash_size ** 2:
            raise SettingError("ANIMEGAN_PHASH_MAX_DISTANCE", (
                f"ANIMEGAN_PHASH_MAX_DISTANCE={self.phash_max_distance} is more than the "
                f"{self.phash_size ** 2} bits of a hash of ANIMEGAN_PHASH_SIZE="
                f"{self.phash_size}: every photo would match; the default is "
                f"{DEFAULTS['ANIMEGAN_PHASH_MAX_DISTANCE']}"))
        if self.max_output_side is not None and self.max_output_side < self.max_side:
            raise SettingError("ANIMEGAN_MAX_OUTPUT_SIDE", (
                f"ANIMEGAN_MAX_OUTPUT_SIDE={self.max_output_side} is under ANIMEGAN_MAX_SIDE="
                f"{self.max_side}, the default size: raise it, or leave it unset for "
                "ANIMEGAN_MAX_SIDE"))
        if (self.content_block != DEFAULTS["ANIMEGAN_CONTENT_BLOCK"]
                and self.base_template == DEFAULTS["ANIMEGAN_BASE_TEMPLATE"]):
            raise SettingError("ANIMEGAN_CONTENT_BLOCK", (
                "ANIMEGAN_CONTENT_BLOCK names a block of your layout: set "
                "ANIMEGAN_BASE_TEMPLATE to that layout too, e.g. 'layout.html'"))


class AnimeGANOptions(TypedDict, total=False):
    """The keyword options of ``AnimeGAN(app, **options)``: one per :class:`Settings`
    field, with its type, so that editors complete them (a test keeps the two in step)."""

    models_dir: str
    shipped_styles: bool
    default_style: str | None
    portrait_scene_style: str | None
    portrait_min_face: int
    portrait_max_faces: int
    url_prefix: str
    max_side: int
    max_output_side: int | None
    max_upload_bytes: int
    max_pixels: int
    max_decode_bytes: int
    max_aspect_ratio: float
    max_jpeg_scans: int
    decode_isolation: str
    decode_timeout: float
    decode_slots: int | None
    rate_limit: str
    storage_uri: str
    ratelimit_storage_uri: str | None
    result_storage_uri: str | None
    trusted_proxies: int
    cache_scope: str
    cache_ttl: int
    cache_max_bytes: int
    phash_size: int
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
    job_ttl: int
    job_max_queue: int
    job_timeout: int
    job_stall_seconds: float
    jobs_per_client: int
    frames_per_conversion: int
    max_frames: int
    max_seconds: float
    max_fps: float
    max_frame_pixels: int
    output_format: str
    jpeg_quality: int
    max_loaded_styles: int
    warmup_size: int
    pad_multiple: int
    weights_base_url: str | None
    extra_styles: dict[str, dict[str, Any]]
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


_KIND_WORDS = {int: "a whole number", float: "a number", bool: "True or False",
               str: "a string", dict: "a mapping (a dict)", list: "a list",
               Hook: "a callable or its dotted path"}


@dataclass(frozen=True)
class Setting:
    """One row of the registry (and of the configuration table), made from a field of
    :class:`Settings`: the key, its default, meaning, type and allowed values."""

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
        """Whether the setting may be unset (None): those whose default is None."""
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
        """``value`` if this setting can use it, else :class:`SettingError` saying why and
        what to give instead. The one check: ``init_app`` and :func:`from_environ` use it."""
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


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(PREFIX + f.name.upper(),
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            f.metadata["meaning"], f.metadata["kind"], f.metadata["low"], f.metadata["high"],
            f.metadata["choices"], f.metadata["check"])
    for f in dataclasses.fields(Settings))
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
_BY_NAME = {s.name: s for s in SETTINGS}


def unknown_keys(config: Mapping[str, Any]) -> dict[str, str | None]:
    """``ANIMEGAN_*`` keys of ``config`` that are no setting, each with the closest
    setting's name (a likely typo) or None."""
    return {key: next(iter(difflib.get_close_matches(key, _BY_NAME, n=1)), None)
            for key in config if key.startswith(PREFIX) and key not in _BY_NAME}


def from_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the ANIMEGAN_* settings present in ``environ``, converted to their types
    and checked by the registry (:class:`SettingError` names the variable and the fix).

    Numbers and switches are parsed from text, a mapping from JSON; an empty variable
    unsets an optional setting (automatic choice) and turns a switch off."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.name)
        if raw is not None:
            found[setting.name] = _from_text(setting, raw)
    return found


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")
_ENV = "environment variable "


def _from_text(setting: Setting, raw: str) -> Any:
    if setting.kind is Hook and raw.strip() == "":
        return None  # an empty variable: no check
    if setting.kind in (str, Hook):
        value: Any = raw
    elif setting.kind is list:  # dotted paths, separated by commas or spaces
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
