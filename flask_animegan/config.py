"""Every configuration key the extension reads, with its default and meaning.

This is the one place config names live. ``init_app`` copies the defaults into
``app.config`` with ``setdefault``; the example app and ``gunicorn.conf.py`` read
the same names from the environment through :func:`from_environ`. The README's
configuration table is generated from (and tested against) :data:`SETTINGS`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    meaning: str
    kind: type = str


def _available_cpus() -> int:
    """CPUs this process may run on (honours taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


SETTINGS: tuple[Setting, ...] = (
    Setting("ANIMEGAN_MODELS_DIR", "models",
            "Folder holding style weights (`NAME.pt`); relative paths are resolved "
            "against the app's root path.", str),
    Setting("ANIMEGAN_DEFAULT_STYLE", None,
            "Style used when a request names none; unset picks the first installed of "
            "`paprika`, `face_paint_512_v2`, `toon_demo`, else the first alphabetically.", str),
    Setting("ANIMEGAN_URL_PREFIX", "/animegan", "URL prefix of the blueprint.", str),
    Setting("ANIMEGAN_MAX_SIDE", 512,
            "Largest allowed long side of the output, in pixels; also the default size.", int),
    Setting("ANIMEGAN_MAX_UPLOAD_BYTES", 16 * 1024 * 1024,
            "Largest accepted request body; larger bodies get 413 before they are read.", int),
    Setting("ANIMEGAN_MAX_PIXELS", 40_000_000,
            "Largest accepted image area (width x height) read from the file header, "
            "checked before decoding; guards against decompression bombs.", int),
    Setting("ANIMEGAN_MAX_DECODE_BYTES", 192 * 1024 * 1024,
            "Largest memory one decode may need: width x height x the bytes per pixel of "
            "its mode (bit depth and bands) plus the RGB copy, read from the header "
            "(JPEGs at their reduced decoding scale). Larger images get 413.", int),
    Setting("ANIMEGAN_MAX_ASPECT_RATIO", 20.0,
            "Largest ratio of an upload's long side to its short side; more gets 413.", float),
    Setting("ANIMEGAN_MAX_JPEG_SCANS", 32,
            "Most scans a JPEG may have (counted before decoding; a progressive JPEG is "
            "decoded once per scan, real ones have about 10).", int),
    Setting("ANIMEGAN_DECODE_ISOLATION", "process",
            "`process`: decode uploads in helper processes with a memory limit, killed after "
            "ANIMEGAN_DECODE_TIMEOUT; `thread`: decode in the server process (same checks "
            "and gate, no hard limits).", str),
    Setting("ANIMEGAN_DECODE_TIMEOUT", 5.0,
            "Seconds one decode may take in its helper process before it is killed (413).",
            float),
    Setting("ANIMEGAN_DECODE_SLOTS", None,
            "Uploads decoded at once per process (more wait, as for the model, up to "
            "ANIMEGAN_MAX_QUEUE, else 503); unset uses the CPUs this process may run on.",
            int),
    Setting("ANIMEGAN_RATE_LIMIT", "5 per minute",
            "flask-limiter limit for the upload and convert routes, per client address; "
            "empty disables it.", str),
    Setting("ANIMEGAN_STORAGE_URI", "memory://",
            "Where the result cache and the result pages live: `memory://` (this process, "
            "bounded by the *_MAX_BYTES settings) or `redis://[:password@]host:port/db` / "
            "`rediss://...` (shared by every instance; bound it with Redis `maxmemory` and an "
            "LRU policy). If Redis is unreachable, conversions go on without the cache.", str),
    Setting("ANIMEGAN_RATELIMIT_STORAGE_URI", None,
            "flask-limiter storage; unset uses ANIMEGAN_STORAGE_URI. `memory://` counts per "
            "process; with Redis, counts are shared, and fall back to per-process memory "
            "while Redis is unreachable.", str),
    Setting("ANIMEGAN_TRUSTED_PROXIES", 0,
            "Reverse proxies in front of the app that append to X-Forwarded-For; the rate "
            "limit keys on the address the outermost trusted one saw (entries that are not IP "
            "addresses are ignored). They must be the only way in. 0: ignore the header.",
            int),
    Setting("ANIMEGAN_CACHE_SCOPE", "client",
            "Who shares cached results: `client` (default: only requests with the same "
            "rate-limit key, the client address) or `global` (every client; a result then "
            "reveals that someone converted the same photo recently).", str),
    Setting("ANIMEGAN_CACHE_TTL", 3600,
            "Seconds a cached result lives; 0 disables the cache.", int),
    Setting("ANIMEGAN_CACHE_MAX_BYTES", 64 * 1024 * 1024,
            "Byte budget of the result cache (least recently used results are evicted).", int),
    Setting("ANIMEGAN_PHASH_SIZE", 16,
            "`hash_size` of `imagehash.phash` used as the cache key (16 gives 256 bits).", int),
    Setting("ANIMEGAN_PHASH_MAX_DISTANCE", 6,
            "Largest Hamming distance between two perceptual hashes that may share a "
            "result (the colour-thumbnail check must pass too).", int),
    Setting("ANIMEGAN_COLOR_TOLERANCE", 0.9,
            "Largest mean absolute difference (0-255 levels, after 3x3 smoothing) between "
            "the 16x16 colour thumbnails of two inputs that may share a result; systematic "
            "shifts must stay under a third of it.", float),
    Setting("ANIMEGAN_LOCAL_TOLERANCE", 1.75,
            "How much any small window (about 5 % x 5 % of the input, on fixed 128x128 luma "
            "and 64x64 colour grids) of two inputs may differ, in multiples of the difference "
            "their re-encoding leaves on similar detail, before they stop sharing a result; "
            "lower catches milder local edits (a blurred face, a sticker) but misses more "
            "re-encoded copies.", float),
    Setting("ANIMEGAN_RESULT_TTL", 3600,
            "Seconds the result page of a form upload (and its images) stays available.", int),
    Setting("ANIMEGAN_RESULT_MAX_BYTES", 64 * 1024 * 1024,
            "Byte budget of the stored result pages (oldest unused evicted first).", int),
    Setting("ANIMEGAN_TORCH_THREADS", None,
            "torch intra-op threads; unset uses the CPUs this process may run on "
            "(`os.sched_getaffinity`).", int),
    Setting("ANIMEGAN_PRECISION", "auto",
            "Inference precision: `auto` (at startup, time the default style in fp32 and "
            "bf16 on this CPU and keep the faster; fp32 without native bf16), `fp32` or "
            "`bf16`.", str),
    Setting("ANIMEGAN_MAX_QUEUE", 2,
            "Conversions allowed to wait while one runs; more get 503 with Retry-After. "
            "Keep it below the server's thread count so the 503 can be sent.", int),
    Setting("ANIMEGAN_QUEUE_TIMEOUT", 60.0,
            "Seconds a queued conversion waits for the model before giving up with 503.", float),
    Setting("ANIMEGAN_OUTPUT_FORMAT", "jpeg", "Default output format: jpeg, png or webp.", str),
    Setting("ANIMEGAN_JPEG_QUALITY", 90, "JPEG and WebP quality of the output.", int),
    Setting("ANIMEGAN_MAX_LOADED_STYLES", 3,
            "How many styles stay loaded in memory (LRU); the default style always does.", int),
    Setting("ANIMEGAN_WARMUP_SIZE", 256,
            "Side of the square image used for the warm-up inference at startup; 0 skips it.",
            int),
    Setting("ANIMEGAN_WEIGHTS_BASE_URL", None,
            "Mirror to download official styles from instead of GitHub "
            "(`{base}/{name}.pt`); the pinned hashes still apply.", str),
    Setting("ANIMEGAN_EXTRA_STYLES", {},
            "Extra pullable styles: a mapping of name to a dict with `url`, `sha1` "
            "(git blob SHA-1) and optionally `licence`, `description`, `face`.", dict),
    Setting("ANIMEGAN_HEALTH_DETAILS", "local",
            "Who sees the details in `{prefix}/healthz` (styles, queue, cache, errors): "
            "`local` (clients on loopback), `all` or `none`; others get only the status.",
            str),
    Setting("ANIMEGAN_CONTENT_SECURITY_POLICY",
            "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'self'",
            "Content-Security-Policy header of the blueprint's responses; loosen it if your "
            "base template loads resources from elsewhere, empty leaves it out.", str),
    Setting("ANIMEGAN_CSRF", True,
            "Require a CSRF token on the upload form when the app has a `SECRET_KEY` (the "
            "JSON API needs none); turn off only if the host app checks every form itself.",
            bool),
    Setting("ANIMEGAN_SAMPLE_SIZE", 128,
            "Long side of the style samples in the page's style picker, converted at startup "
            "from a bundled photo; 0: no samples.", int),
    Setting("ANIMEGAN_METRICS", False,
            "Serve Prometheus metrics at `{prefix}/metrics` (needs `prometheus_client`; under "
            "gunicorn, `gunicorn.conf.py` turns on its multiprocess mode). Restrict who can "
            "reach that path.", bool),
    Setting("ANIMEGAN_BASE_TEMPLATE", "animegan/base.html",
            "Template the pages extend; point it at your site's layout (it must "
            "define the `animegan_content` block).", str),
)

DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}
OUTPUT_FORMATS = ("jpeg", "png", "webp")
PRECISIONS = ("auto", "fp32", "bf16")
CACHE_SCOPES = ("client", "global")
ISOLATIONS = ("process", "thread")
HEALTH_DETAILS = ("local", "all", "none")


def from_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Return the ANIMEGAN_* settings present in ``environ``, converted to their types."""
    environ = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = environ.get(setting.name)
        if raw is None:
            continue
        if setting.kind is dict:
            try:
                found[setting.name] = json.loads(raw)
            except ValueError:
                raise ValueError(f"environment variable {setting.name} must be a JSON object, "
                                 f'e.g. {{"mystyle": {{"url": "...", "sha1": "..."}}}}') from None
            continue
        if setting.kind is bool:
            found[setting.name] = _parse_bool(setting.name, raw)
            continue
        if raw == "" and setting.kind is not str:
            found[setting.name] = None  # an empty variable means "use the automatic choice"
            continue
        try:
            found[setting.name] = setting.kind(raw)
        except ValueError:
            raise ValueError(
                f"environment variable {setting.name}={raw!r} is not a valid "
                f"{setting.kind.__name__}; unset it or give e.g. {setting.default!r}"
            ) from None
    return found


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ValueError(f"environment variable {name}={raw!r} must be one of "
                     f"{', '.join(_TRUE)} or {', '.join(_FALSE[:-1])}")


def torch_threads(config: Mapping[str, Any]) -> int:
    """The intra-op thread count to use: the configured value, else the usable CPUs."""
    value = config.get("ANIMEGAN_TORCH_THREADS")
    return int(value) if value else _available_cpus()


def decode_slots(config: Mapping[str, Any]) -> int:
    """Uploads decoded at once: the configured value, else the usable CPUs."""
    value = config.get("ANIMEGAN_DECODE_SLOTS")
    return int(value) if value else _available_cpus()


def validate(config: Mapping[str, Any]) -> None:
    """Raise ValueError naming the key and the fix for any unusable setting."""
    def positive(name: str, allow_zero: bool = False) -> None:
        value = config[name]
        if not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
            raise ValueError(
                f"{name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} "
                f"number; the default is {DEFAULTS[name]!r}"
            )

    for name in ("ANIMEGAN_MAX_SIDE", "ANIMEGAN_MAX_UPLOAD_BYTES", "ANIMEGAN_MAX_PIXELS",
                 "ANIMEGAN_PHASH_SIZE", "ANIMEGAN_MAX_LOADED_STYLES", "ANIMEGAN_QUEUE_TIMEOUT",
                 "ANIMEGAN_RESULT_TTL", "ANIMEGAN_RESULT_MAX_BYTES", "ANIMEGAN_MAX_DECODE_BYTES",
                 "ANIMEGAN_MAX_JPEG_SCANS", "ANIMEGAN_DECODE_TIMEOUT"):
        positive(name)
    for name in ("ANIMEGAN_TRUSTED_PROXIES", "ANIMEGAN_CACHE_TTL", "ANIMEGAN_CACHE_MAX_BYTES",
                 "ANIMEGAN_PHASH_MAX_DISTANCE", "ANIMEGAN_COLOR_TOLERANCE", "ANIMEGAN_MAX_QUEUE",
                 "ANIMEGAN_LOCAL_TOLERANCE",
                 "ANIMEGAN_WARMUP_SIZE", "ANIMEGAN_SAMPLE_SIZE"):
        positive(name, allow_zero=True)
    if config["ANIMEGAN_MAX_SIDE"] < 16:
        raise ValueError("ANIMEGAN_MAX_SIDE must be at least 16 pixels")
    if config["ANIMEGAN_OUTPUT_FORMAT"] not in OUTPUT_FORMATS:
        raise ValueError(
            f"ANIMEGAN_OUTPUT_FORMAT={config['ANIMEGAN_OUTPUT_FORMAT']!r} is not one of "
            f"{', '.join(OUTPUT_FORMATS)}"
        )
    if config["ANIMEGAN_MAX_ASPECT_RATIO"] < 1:
        raise ValueError("ANIMEGAN_MAX_ASPECT_RATIO must be at least 1 (a square); the "
                         f"default is {DEFAULTS['ANIMEGAN_MAX_ASPECT_RATIO']}")
    for name, choices in (("ANIMEGAN_CACHE_SCOPE", CACHE_SCOPES),
                          ("ANIMEGAN_DECODE_ISOLATION", ISOLATIONS),
                          ("ANIMEGAN_HEALTH_DETAILS", HEALTH_DETAILS)):
        if config[name] not in choices:
            raise ValueError(f"{name}={config[name]!r} is not one of {', '.join(choices)}")
    if config["ANIMEGAN_PRECISION"] not in PRECISIONS:
        raise ValueError(f"ANIMEGAN_PRECISION={config['ANIMEGAN_PRECISION']!r} is not one of "
                         f"{', '.join(PRECISIONS)}")
    if not str(config["ANIMEGAN_URL_PREFIX"]).startswith("/"):
        raise ValueError("ANIMEGAN_URL_PREFIX must start with '/', e.g. '/animegan'")
    for name in ("ANIMEGAN_TORCH_THREADS", "ANIMEGAN_DECODE_SLOTS"):
        value = config.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} must be a positive integer or unset")
