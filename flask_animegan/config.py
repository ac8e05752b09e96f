"""Every configuration key the extension reads: one typed object, one place for defaults.

:class:`Settings` lists each setting once, as a field with its type, default and one
line of meaning. ``init_app`` copies the defaults into ``app.config`` (``setdefault``)
and reads them back once, checked, with :meth:`Settings.from_config`; the example app
and ``gunicorn.conf.py`` read the same names from the environment through
:func:`from_environ`. The README's configuration table is generated from (and tested
against) :data:`SETTINGS`. A field ``max_side`` is the key ``ANIMEGAN_MAX_SIDE``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

PREFIX = "ANIMEGAN_"
OUTPUT_FORMATS = ("jpeg", "png", "webp")
PRECISIONS = ("auto", "fp32", "bf16")
BACKENDS = ("auto", "torch", "openvino")
CACHE_SCOPES = ("client", "global")
ISOLATIONS = ("process", "thread")
HEALTH_DETAILS = ("local", "all", "none")


def _setting(default: Any, kind: type, meaning: str) -> Any:
    """A field of :class:`Settings`: its default, the type environment values convert to,
    and its meaning (the README's configuration table)."""
    metadata = {"kind": kind, "meaning": meaning}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def available_cpus() -> int:
    """CPUs this process may run on (honours taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    """The extension's settings for one app, read once from ``app.config`` and checked."""

    models_dir: str = _setting(
        'models', str,
        'Folder holding style weights (`NAME.pt`); relative paths are resolved against '
        "the app's root path.")
    shipped_styles: bool = _setting(
        True, bool,
        'Also serve the styles shipped inside the package (`toon_demo`, a small demo '
        'style) besides those of ANIMEGAN_MODELS_DIR, where a file of the same name wins; '
        'false serves only the models folder.')
    default_style: str | None = _setting(
        None, str,
        'Style used when a request names none; unset picks the first installed of '
        "`paprika`, `face_paint_512_v2`, else the models folder's first alphabetically, "
        'else the shipped `toon_demo`.')
    url_prefix: str = _setting(
        '/animegan', str,
        'URL prefix of the blueprint.')
    max_side: int = _setting(
        512, int,
        'Largest allowed long side of the output, in pixels; also the default size.')
    max_upload_bytes: int = _setting(
        16 * 1024 * 1024, int,
        'Largest accepted request body; larger bodies get 413 before they are read.')
    max_pixels: int = _setting(
        40000000, int,
        'Largest accepted image area (width x height) read from the file header, '
        'checked before decoding; guards against decompression bombs.')
    max_decode_bytes: int = _setting(
        192 * 1024 * 1024, int,
        'Largest memory one decode may need: width x height x the bytes per pixel of '
        'its mode (bit depth and bands) plus the RGB copy, read from the header (JPEGs '
        'at their reduced decoding scale). Larger images get 413.')
    max_aspect_ratio: float = _setting(
        20.0, float,
        "Largest ratio of an upload's long side to its short side; more gets 413.")
    max_jpeg_scans: int = _setting(
        32, int,
        'Most scans a JPEG may have (counted before decoding; a progressive JPEG is '
        'decoded once per scan, real ones have about 10).')
    decode_isolation: str = _setting(
        'process', str,
        '`process`: decode uploads in helper processes with a memory limit, killed '
        'after ANIMEGAN_DECODE_TIMEOUT; `thread`: decode in the server process (same '
        'checks and gate, no hard limits).')
    decode_timeout: float = _setting(
        5.0, float,
        'Seconds one decode may take in its helper process before it is killed (413).')
    decode_slots: int | None = _setting(
        None, int,
        'Uploads decoded at once per process (more wait, as for the model, up to '
        'ANIMEGAN_MAX_QUEUE, else 503); unset uses the CPUs this process may run on.')
    rate_limit: str = _setting(
        '5 per minute', str,
        'flask-limiter limit for the upload and convert routes, per client address; '
        'empty disables it.')
    storage_uri: str = _setting(
        'memory://', str,
        'Where the result cache and the result pages live: `memory://` (this process, '
        'bounded by the *_MAX_BYTES settings) or `redis://[:password@]host:port/db` / '
        '`rediss://...` (shared by every instance; bound it with Redis `maxmemory` and '
        'an LRU policy). If Redis is unreachable, conversions go on without the cache.')
    ratelimit_storage_uri: str | None = _setting(
        None, str,
        'flask-limiter storage; unset uses ANIMEGAN_STORAGE_URI. `memory://` counts per '
        'process; with Redis, counts are shared, and fall back to per-process memory '
        'while Redis is unreachable.')
    trusted_proxies: int = _setting(
        0, int,
        'Reverse proxies in front of the app that append to X-Forwarded-For; the rate '
        'limit keys on the address the outermost trusted one saw (entries that are not '
        'IP addresses are ignored). They must be the only way in. 0: ignore the header.')
    cache_scope: str = _setting(
        'client', str,
        'Who shares cached results: `client` (default: only requests with the same '
        'rate-limit key, the client address) or `global` (every client; a result then '
        'reveals that someone converted the same photo recently).')
    cache_ttl: int = _setting(
        3600, int,
        'Seconds a cached result lives; 0 disables the cache.')
    cache_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the result cache (least recently used results are evicted). An '
        'entry holds its result, its input as lossless WebP (for the exact JPEG re-save '
        'check; 50-380 KiB at 512 px, median 190), a 29 KiB fingerprint and, for a JPEG or '
        'PNG upload larger than the output, the uploaded file itself, without metadata, if '
        'it has at most 8 MiB and 12.6 megapixels (the same check at its own size).')
    phash_size: int = _setting(
        16, int,
        '`hash_size` of `imagehash.phash` used as the cache key (16 gives 256 bits).')
    phash_max_distance: int = _setting(
        6, int,
        'Largest Hamming distance between two perceptual hashes that may share a result '
        '(the colour-thumbnail check must pass too).')
    color_tolerance: float = _setting(
        0.9, float,
        'Largest mean absolute difference (0-255 levels, after 3x3 smoothing) between '
        'the 16x16 colour thumbnails of two inputs that may share a result; systematic '
        'shifts must stay under a third of it.')
    local_tolerance: float = _setting(
        1.75, float,
        'How much any small window (about 5 % x 5 % of the input, on fixed 128x128 luma '
        'and 64x64 colour grids) of two inputs may differ, in multiples of the '
        'difference their re-encoding leaves on similar detail, before they stop '
        'sharing a result; lower catches milder local edits (a blurred face, a sticker) '
        'but misses more re-encoded copies.')
    result_ttl: int = _setting(
        3600, int,
        'Seconds the result page of a form upload (and its images) stays available.')
    result_max_bytes: int = _setting(
        64 * 1024 * 1024, int,
        'Byte budget of the stored result pages (oldest unused evicted first).')
    torch_threads: int | None = _setting(
        None, int,
        'torch intra-op threads; unset uses the CPUs this process may run on '
        '(`os.sched_getaffinity`).')
    precision: str = _setting(
        'auto', str,
        'Inference precision: `auto` (at startup, time the default style in fp32 and '
        'bf16 on this CPU and keep the faster; fp32 without native bf16), `fp32` or '
        '`bf16`.')
    backend: str = _setting(
        'auto', str,
        'What runs the network: `auto` (at startup, time torch and, with the `openvino` '
        'extra installed, OpenVINO in each precision ANIMEGAN_PRECISION allows on the '
        'default style, and keep the fastest whose pictures stay within 40 dB PSNR of '
        'torch fp32), `torch` or `openvino` (torch, with a warning, if the extra is '
        'missing). Each style is checked when it loads; one that fails runs on torch fp32.')
    model_cache_dir: str | None = _setting(
        None, str,
        "Folder for OpenVINO's converted styles and compiled models, so that a restart "
        'converts and compiles nothing; unset: `$XDG_CACHE_HOME/flask-animegan` (else '
        '`~/.cache/flask-animegan`); empty: no cache. Relative to the working directory.')
    max_queue: int = _setting(
        2, int,
        'Conversions allowed to wait while one runs; more get 503 with Retry-After. '
        "Keep it below the server's thread count so the 503 can be sent.")
    queue_timeout: float = _setting(
        60.0, float,
        'Seconds a queued conversion waits for the model before giving up with 503.')
    output_format: str = _setting(
        'jpeg', str,
        'Default output format: jpeg, png or webp.')
    jpeg_quality: int = _setting(
        90, int,
        'JPEG and WebP quality of the output.')
    max_loaded_styles: int = _setting(
        3, int,
        'How many styles stay loaded in memory (LRU); the default style always does.')
    warmup_size: int = _setting(
        256, int,
        'Side of the square image of the warm-up inference, run when the serving '
        "process warms up (gunicorn.conf.py's post_worker_init, or `warm_up()`); 0 "
        'skips it.')
    weights_base_url: str | None = _setting(
        None, str,
        'Mirror to download official styles from instead of GitHub '
        '(`{base}/{name}.pt`); the pinned hashes still apply.')
    extra_styles: dict[str, dict[str, Any]] = _setting(
        {}, dict,
        'Extra pullable styles: a mapping of name to a dict with `url`, `sha1` (git '
        'blob SHA-1) and optionally `licence`, `description`, `face`.')
    health_details: str = _setting(
        'local', str,
        'Who sees the details in `{prefix}/healthz` (styles, queue, cache, errors): '
        '`local` (clients on loopback), `all` or `none`; others get only the status.')
    content_security_policy: str = _setting(
        "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'", str,
        "Content-Security-Policy header of the blueprint's responses; empty leaves it out. "
        'With your own layout (ANIMEGAN_BASE_TEMPLATE), the default is not sent: your site '
        'sends its own policy (allow `blob:` images); a policy you set here is sent.')
    csrf: bool = _setting(
        True, bool,
        "The extension's own CSRF token on the upload form, when the app has a "
        "`SECRET_KEY` (the JSON API needs none). With Flask-WTF's `CSRFProtect` on the "
        "app, its token and check are used instead and this setting does nothing.")
    sample_size: int = _setting(
        128, int,
        "Long side of the style samples in the page's style picker, converted from a "
        'bundled photo at warm-up (or on first view); 0: no samples.')
    metrics: bool = _setting(
        False, bool,
        'Serve Prometheus metrics at `{prefix}/metrics` (needs `prometheus_client`; '
        'under gunicorn, `gunicorn.conf.py` turns on its multiprocess mode). Restrict '
        'who can reach that path.')
    base_template: str = _setting(
        'animegan/base.html', str,
        "Template the pages extend; point it at your site's layout, and set "
        'ANIMEGAN_CONTENT_BLOCK to its content block.')
    content_block: str = _setting(
        'animegan_content', str,
        'Block of ANIMEGAN_BASE_TEMPLATE that the pages fill, e.g. `content` for a '
        "site's layout; the built-in base template's is `animegan_content`.")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Read every ``ANIMEGAN_*`` key (missing ones take their defaults) and check them;
        ValueError names the key and the fix."""
        values = {f.name: config[PREFIX + f.name.upper()] for f in dataclasses.fields(cls)
                  if PREFIX + f.name.upper() in config}
        settings = cls(**values)
        settings.validate()
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

    # -- checks ----------------------------------------------------------------
    def validate(self) -> None:
        """Raise ValueError naming the key and the fix for any unusable setting."""
        for name in ("max_side", "max_upload_bytes", "max_pixels", "phash_size",
                     "max_loaded_styles", "queue_timeout", "result_ttl", "result_max_bytes",
                     "max_decode_bytes", "max_jpeg_scans", "decode_timeout"):
            self._positive(name)
        for name in ("trusted_proxies", "cache_ttl", "cache_max_bytes", "phash_max_distance",
                     "color_tolerance", "max_queue", "local_tolerance", "warmup_size",
                     "sample_size"):
            self._positive(name, allow_zero=True)
        if self.max_side < 16:
            raise ValueError("ANIMEGAN_MAX_SIDE must be at least 16 pixels")
        if self.max_aspect_ratio < 1:
            raise ValueError("ANIMEGAN_MAX_ASPECT_RATIO must be at least 1 (a square); the "
                             f"default is {DEFAULTS['ANIMEGAN_MAX_ASPECT_RATIO']}")
        for name, choices in (("output_format", OUTPUT_FORMATS), ("precision", PRECISIONS),
                              ("backend", BACKENDS),
                              ("cache_scope", CACHE_SCOPES), ("decode_isolation", ISOLATIONS),
                              ("health_details", HEALTH_DETAILS)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{PREFIX}{name.upper()}={getattr(self, name)!r} is not one "
                                 f"of {', '.join(choices)}")
        if not str(self.url_prefix).startswith("/"):
            raise ValueError("ANIMEGAN_URL_PREFIX must start with '/', e.g. '/animegan'")
        for name in ("torch_threads", "decode_slots"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{PREFIX}{name.upper()}={value!r} must be a positive "
                                 "integer or unset")
        if not (isinstance(self.content_block, str) and self.content_block.isidentifier()):
            raise ValueError(f"ANIMEGAN_CONTENT_BLOCK={self.content_block!r} must be the name "
                             "of a block of your layout, e.g. 'content'")
        if (self.content_block != DEFAULTS["ANIMEGAN_CONTENT_BLOCK"]
                and self.base_template == DEFAULTS["ANIMEGAN_BASE_TEMPLATE"]):
            raise ValueError("ANIMEGAN_CONTENT_BLOCK names a block of your layout: set "
                             "ANIMEGAN_BASE_TEMPLATE to that layout too, e.g. 'layout.html'")
        for name in ("storage_uri", "ratelimit_storage_uri"):
            value = getattr(self, name)
            if value is not None and "://" not in str(value):
                raise ValueError(f"{PREFIX}{name.upper()}={value!r} is not a URI; use "
                                 "memory:// or redis://host:6379/0")

    def _positive(self, name: str, allow_zero: bool = False) -> None:
        value = getattr(self, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
                or (value == 0 and not allow_zero)):
            key = PREFIX + name.upper()
            raise ValueError(
                f"{key}={value!r} must be a {'non-negative' if allow_zero else 'positive'} "
                f"number; the default is {DEFAULTS[key]!r}")


class AnimeGANOptions(TypedDict, total=False):
    """The keyword options of ``AnimeGAN(app, **options)``: one per :class:`Settings`
    field, with its type, so that editors complete them (a test keeps the two in step)."""

    models_dir: str
    shipped_styles: bool
    default_style: str | None
    url_prefix: str
    max_side: int
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
    trusted_proxies: int
    cache_scope: str
    cache_ttl: int
    cache_max_bytes: int
    phash_size: int
    phash_max_distance: int
    color_tolerance: float
    local_tolerance: float
    result_ttl: int
    result_max_bytes: int
    torch_threads: int | None
    precision: str
    backend: str
    model_cache_dir: str | None
    max_queue: int
    queue_timeout: float
    output_format: str
    jpeg_quality: int
    max_loaded_styles: int
    warmup_size: int
    weights_base_url: str | None
    extra_styles: dict[str, dict[str, Any]]
    health_details: str
    content_security_policy: str
    csrf: bool
    sample_size: int
    metrics: bool
    base_template: str
    content_block: str


@dataclass(frozen=True)
class Setting:
    """One row of the configuration table."""

    name: str
    default: Any
    meaning: str
    kind: type = str


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(PREFIX + f.name.upper(),
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default,
            f.metadata["meaning"], f.metadata["kind"])
    for f in dataclasses.fields(Settings))
DEFAULTS: dict[str, Any] = {s.name: s.default for s in SETTINGS}


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
