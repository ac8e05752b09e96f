"""The blueprint: the upload page, its result pages, the image API, styles and health."""

from __future__ import annotations

import base64
import io
import json
import logging
import time
import weakref
from types import SimpleNamespace
from typing import Any, NoReturn
from urllib.parse import urlsplit

from flask import (
    Response,
    abort,
    current_app,
    g,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from flask_limiter.errors import RateLimitExceeded
from jinja2 import Environment, Template
from markupsafe import Markup, escape
from PIL import Image
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, default_exceptions
from werkzeug.routing import RequestRedirect
from werkzeug.wrappers import Response as BaseResponse
from werkzeug.wsgi import get_input_stream

from ..config import DEFAULTS, OUTPUT_FORMATS
from ..convert.converter import Conversion, describe_timings
from ..convert.request import parameter_word, parse_strength
from ..convert.strength import FULL
from ..errors import (
    BadParameter,
    ConversionError,
)
from ..outputs.stills import encode
from ..service import WARMING_RETRY_AFTER, get_service
from ..storage.pages import StoredResult
from . import bodies, csrf, protection, uploads
from .blueprint import blueprint
from .clients import client_address, is_loopback
from .limits import conversion_cost, deducts

#: The job API's endpoints, all JSON (its page, ``job_page``, is HTML).
JOB_API_ENDPOINTS = frozenset({"animegan.create_job", "animegan.job", "animegan.cancel_job",
                               "animegan.job_result", "animegan.job_preview",
                               "animegan.job_partial"})
#: Endpoints that answer JSON (errors included); the others render pages.
API_ENDPOINTS = frozenset({"animegan.convert", "animegan.styles", "animegan.healthz",
                           "animegan.style_sample", "animegan.metrics",
                           "animegan.openapi"}) | JOB_API_ENDPOINTS
#: The POST routes that spend CPU on a conversion; they share the rate limit.
LIMITED_ENDPOINTS = frozenset({"animegan.upload", "animegan.convert", "animegan.create_job"})
#: Output sizes the form may offer, up to ANIMEGAN_MAX_OUTPUT_SIDE.
FORM_SIZES = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
#: Most seconds a refused conversion's upload is read before its 503 (_drop_body).
DROP_BODY_SECONDS = 1.0
#: The form's choices (value, label).
COLOR_CHOICES = (("off", "The style's own colours"), ("luma", "Keep the photo's brightness"),
                 ("keep", "Keep the photo's colours"))
PORTRAIT_CHOICES = (("auto", "Find faces with face styles"), ("on", "Find faces, any style"),
                    ("off", "Do not look for faces"), ("faces", "Only the faces"))
#: A form with many more parts than the fields we read is not ours.
MAX_FORM_PARTS = 32
BUILT_IN_BASE = DEFAULTS["ANIMEGAN_BASE_TEMPLATE"]
log = logging.getLogger("flask_animegan")
#: The block adapters of _layout, per Jinja environment (one per app) and block name.
_adapters: weakref.WeakKeyDictionary[Environment, dict[str, Template]] = (
    weakref.WeakKeyDictionary())


# A URL value preprocessor, not before_request: these run before every before_request
# function, and Flask-WTF's CSRFProtect reads the upload in one of those.
@blueprint.url_value_preprocessor
def _prepare_request(endpoint: str | None, values: dict[str, Any] | None) -> None:
    # the site's checks first: a visitor they turn away takes no slot and no rate limit
    protection.guard(endpoint)
    if endpoint in LIMITED_ENDPOINTS:
        # a full app answers 503 before the upload is read; an upload counts against the
        # admission once it has arrived (read_upload): until then its deadline bounds it
        g.animegan_reading = get_service().admission.start_reading()
        g.animegan_body = bodies.time_the_body(request.environ)
    # a chunked body is cut at the limit silently: one byte more lets read_upload refuse it
    limit = get_service().settings.max_upload_bytes
    limit = limit if request.content_length is not None else limit + 1
    try:
        request.max_content_length = limit
    except AttributeError:  # Flask 3.0: a read-only property; the stream takes the limit
        try:
            request.stream = get_input_stream(request.environ, max_content_length=limit)
        except RequestEntityTooLarge:
            request.stream = io.BufferedReader(_RefusedBody())
    request.max_form_parts = MAX_FORM_PARTS
    csrf.exempt_from_host(convert)  # why that is safe: csrf.py


class _RefusedBody(io.RawIOBase):
    """The body of a request whose Content-Length is over the limit (Flask 3.0)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise RequestEntityTooLarge()


@blueprint.after_request
def _drop_unread_body(response: Response) -> Response:
    """Under gunicorn, drop the unread rest of a conversion's upload: gunicorn closes on an
    unread body, and the kernel's reset can destroy the answer before the client reads it."""
    if request.endpoint in LIMITED_ENDPOINTS and request.method == "POST":
        _drop_body(get_service().settings.max_upload_bytes)
    return response


def _drop_body(limit: int) -> bool:
    """Drop the rest of the body, within DROP_BODY_SECONDS and ``limit``; True if all read."""
    length = request.content_length
    if length is not None and length > limit:
        return False  # more than the limit: not worth reading (413 says so)
    sock = request.environ.get("gunicorn.socket")
    if sock is None:
        return False  # no socket to bound the reads: a stalled client could hold the thread
    deadline = time.monotonic() + DROP_BODY_SECONDS
    left = limit + 1
    try:
        stream = request.stream  # knows what the view read already, and where the body ends
        while left > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            sock.settimeout(remaining)
            chunk = stream.read(min(left, 1 << 20))
            if not chunk:
                return True
            left -= len(chunk)
        return False  # past the limit
    except (OSError, ValueError, HTTPException):  # socket.timeout is an OSError
        return False
    finally:
        sock.settimeout(None)


@blueprint.teardown_request
def _leave_admission(error: BaseException | None) -> None:
    for name in ("animegan_reading", "animegan_admission"):
        ticket = g.pop(name, None)
        if ticket is not None:
            ticket.leave()
    body = g.pop("animegan_body", None)
    if body is not None:
        bodies.release(body)


def content_security_policy() -> str:
    """ANIMEGAN_CONTENT_SECURITY_POLICY, except its default (made for the built-in base
    template) with the site's own layout: that layout's inline scripts need the site's policy."""
    settings = get_service().settings
    policy = settings.content_security_policy
    if (policy == DEFAULTS["ANIMEGAN_CONTENT_SECURITY_POLICY"]
            and settings.base_template != BUILT_IN_BASE):
        return ""
    return policy


def add_security_headers(response: Response) -> Response:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    policy = content_security_policy()
    if policy:
        response.headers.setdefault("Content-Security-Policy", policy)
    return response


@blueprint.after_request
def _security_headers(response: Response) -> Response:
    return add_security_headers(response)


@blueprint.after_request
def _rate_limit_headers(response: Response) -> Response:
    """X-RateLimit-* on the limited routes; Retry-After only on 429 and 503. A storage
    that fails here costs the headers, never the finished conversion."""
    service = get_service()
    current = service.limiter.current_limit if service.rate_limit_headers else None
    if current is not None and request.endpoint in LIMITED_ENDPOINTS:
        window = _window(current)
        if window is not None:
            # flask-limiter takes this request's cost after us (none for a refusal)
            remaining = max(0, window[0] - (conversion_cost() if deducts(response) else 0))
            response.headers.setdefault("X-RateLimit-Limit", str(current.limit.amount))
            response.headers.setdefault("X-RateLimit-Remaining", str(remaining))
            response.headers.setdefault("X-RateLimit-Reset", str(window[1]))
    if response.status_code not in (429, 503):
        response.headers.pop("Retry-After", None)
    return response


def _window(current: Any) -> tuple[int, int] | None:
    """``(remaining, reset_at)`` of a RequestLimit, or ``None`` when its storage fails."""
    try:
        return int(current.remaining), int(current.reset_at)
    except Exception:  # noqa: BLE001 - any storage failure: go on without the figures
        log.debug("flask_animegan: the rate-limit window could not be read", exc_info=True)
        return None


def _under_our_routes(path: str, prefix: str) -> bool:
    """Whether ``path`` is ours: under the prefix or, at the root, under a route's first segment."""
    if prefix:
        return path == prefix or path.startswith(prefix + "/")
    first = path.split("/", 2)[1] if path.startswith("/") else ""
    return first != "" and any(
        rule.rule.split("/", 2)[1] == first for rule in current_app.url_map.iter_rules()
        if (rule.endpoint or "").startswith(f"{blueprint.name}."))


def routing_error_response(response: Response) -> Response:
    """Our JSON error for a request under our prefix that matched no route, whatever the
    host's handlers made of it (registered on the app: Flask sends such requests only there)."""
    if request.routing_exception is None or request.blueprint is not None:
        return response
    if not _under_our_routes(request.path, get_service().settings.url_prefix.rstrip("/")):
        return response
    if isinstance(request.routing_exception, RequestRedirect):
        # Werkzeug's slash redirect is built from the client's Host header: keep the path only
        parts = urlsplit(request.routing_exception.new_url)
        response.headers["Location"] = parts.path + (f"?{parts.query}" if parts.query else "")
        return add_security_headers(response)
    error = request.routing_exception
    if isinstance(error, HTTPException) and error.code:
        body = jsonify(error=error.description or error.name, status=error.code)
        response.status_code = error.code
        response.set_data(body.get_data())
        response.mimetype = "application/json"
        for name, value in error.get_headers():  # a 405's Allow
            if name.lower() != "content-type":
                response.headers[name] = value
    return add_security_headers(response)


@blueprint.after_request
def _count_request(response: Response) -> Response:
    metrics = get_service().metrics
    if metrics is not None:
        metrics.request_done(request.endpoint, response.status_code)
    return response


def page_context(layout: str | Template | None = None, **extra: Any) -> SimpleNamespace:
    """What the page templates read, as one variable ``animegan``, so that the site's
    own template globals (``csrf_token()``, ``current_user``) stay unshadowed."""
    service = get_service()
    settings = service.settings
    styles = service.styles_info()
    installed = [s for s in styles if s["installed"]]
    error = extra.pop("error", None)
    return SimpleNamespace(
        layout=layout or _layout(settings.base_template, settings.content_block),
        base_template=settings.base_template,
        styles=installed,
        pullable=[s for s in styles if not s["installed"]],
        face_styles=any(s["face_crop"] for s in installed),
        # `flask animegan pull ...` is for whoever runs the site, not for its visitors
        admin_hints=protection.is_admin(),
        default_style=service.engine.default_style,
        max_side=settings.max_side,
        sizes=sorted({s for s in FORM_SIZES if s < service.sizes.photo}
                     | {settings.max_side, service.sizes.photo}),
        formats=OUTPUT_FORMATS,
        default_format=settings.output_format,
        colors=COLOR_CHOICES,
        portraits=PORTRAIT_CHOICES,
        accept=uploads.PICKER_ACCEPT,
        max_upload_bytes=settings.max_upload_bytes,
        max_upload_text=_size(settings.max_upload_bytes),
        max_clip_text=(f"{settings.max_seconds:g} seconds" if settings.max_seconds < 90
                       else duration(round(settings.max_seconds))),
        sample_size=settings.sample_size,
        rate_limit=settings.rate_limit,
        csrf_field=csrf.form_field(),
        error=sentence(error) if error else None,
        kept_for=duration(settings.result_ttl),
        page_title=page_title,
        cli_command=service.cli_command,
        **extra,
    )


class PageNotRendered(RuntimeError):
    """A page of ours failed in the site's layout or renderer (the message says which)."""


def render_page(template: str, animegan: SimpleNamespace) -> str:
    """One of our pages, through ANIMEGAN_RENDER_TEMPLATE (Flask's, or the site's own, e.g.
    its theme manager's); a failure names the settings that choose the layout."""
    service = get_service()
    try:
        return service.render_template(template, animegan=animegan)
    except HTTPException:
        raise
    except Exception as exc:
        settings = service.settings
        raise PageNotRendered(
            f"{template} could not be rendered in ANIMEGAN_BASE_TEMPLATE="
            f"{settings.base_template!r} through ANIMEGAN_RENDER_TEMPLATE="
            f"{_hook_name(settings.render_template)}: {type(exc).__name__}: {exc}. A layout "
            "that calls a theme manager's functions (Flask-Themes2's theme(), theme_static()) "
            "renders only through that manager: set ANIMEGAN_RENDER_TEMPLATE to a function "
            "that renders through it (docs/integration.md, Themed layouts)") from exc


def _hook_name(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    return getattr(value, "__qualname__", None) or repr(value)


def duration(seconds: int) -> str:
    """How long a result is kept, as the pages say it: whole minutes, or hours from 2 h."""
    minutes = max(1, round(seconds / 60))
    if minutes >= 120:
        return f"{round(minutes / 60)} hours"
    return f"{minutes} minute{'' if minutes == 1 else 's'}"


def page_title(title: str, layout: str) -> Markup:
    """What the pages put into the layout's ``title`` block: the layout's own text where it
    shows ``title`` already (it reads the ``title`` or ``page_title`` variable, as FlaskBB's
    does, and adds the site's name), else the page's title (the site's name is around)."""
    own = Markup(layout.strip()) if isinstance(layout, Markup) else escape(layout.strip())
    return own if escape(title) in own else escape(title)


def _layout(base_template: str, block: str) -> str | Template:
    """The template the pages extend: the base template, or an adapter that puts
    ``animegan_content`` into ``block`` (Jinja takes no block name from a variable)."""
    if block == DEFAULTS["ANIMEGAN_CONTENT_BLOCK"]:
        return base_template
    env = current_app.jinja_env
    adapters = _adapters.setdefault(env, {})
    if block not in adapters:
        # the block name is checked (an identifier) by Settings.validate
        adapters[block] = env.from_string(
            "{% extends animegan.base_template %}"
            f"{{% block {block} %}}{{% block animegan_content %}}{{% endblock %}}{{% endblock %}}")
    return adapters[block]


def sentence(message: str) -> str:
    """An error message as pages show it (as animegan.js does): capitalised, with a full stop."""
    message = message.strip()
    if message and message[-1] not in ".!?":
        message += "."
    return message[:1].upper() + message[1:]


#: Pages with a visitor's own state (CSRF token, result URL) stay out of shared caches.
INDEX_CACHE_CONTROL = "private, no-cache"
RESULT_CACHE_CONTROL = "private, no-store"
#: Values of ``?download=`` on a result image: an attachment, or shown inline.
_YES, _NO = frozenset({"1", "true", "yes", "on"}), frozenset({"", "0", "false", "no", "off"})


@blueprint.get("/")
def index() -> Response:
    response = make_response(render_page("animegan/index.html", page_context()))
    response.headers["Cache-Control"] = INDEX_CACHE_CONTROL
    return response


@blueprint.post("/upload")
def upload() -> BaseResponse:
    csrf.check()
    received = uploads.receive()
    if received.media is not None:  # an animation or a video: its job's page
        record = uploads.start_job(received.data, received.params, received.media)
        return redirect(url_for(".job_page", job_id=record.id), code=303)
    conversion = uploads.convert_photo(received)
    service = get_service()
    stored = StoredResult(  # at full strength: the page mixes every other strength from it
        original=encode(conversion.input(), "jpeg", service.settings.jpeg_quality),
        result=conversion.full(), mimetype=conversion.mimetype, style=conversion.style,
        size=conversion.size, note=describe_options(conversion))
    token = service.results.add(stored)
    strength = conversion.strength
    if token is None:
        # the page store is down or full: the page itself, pictures inline
        return _result_page(stored, token=None, strength=strength,
                            mixed=conversion.data)
    return redirect(url_for(".result", token=token,
                            strength=strength if strength < FULL else None), code=303)


@blueprint.get("/result/<token>")
def result(token: str) -> Response:
    strength = parse_strength(request.args.get("strength"))
    stored = get_service().results.get(token)
    if stored is None:
        abort(404, "this result has expired or never existed; convert the photo again")
    return _result_page(stored, token, strength)


def _result_page(stored: StoredResult, token: str | None, strength: int = FULL,
                 mixed: bytes | None = None) -> Response:
    """The result page: its pictures at their URLs, or inline (``data:``) without a token;
    the anime picture at ``strength`` (``mixed``: already mixed, for the inline page)."""
    at = strength if strength < FULL else None
    if token is not None:
        sources = {
            "original": url_for(".result_image", token=token, kind="original"),
            "anime": url_for(".result_image", token=token, kind="anime", strength=at),
            "full": url_for(".result_image", token=token, kind="anime"),
            "download": url_for(".result_image", token=token, kind="anime", download=1,
                                strength=at),
            "strength": url_for(".result", token=token)}
    else:
        anime = _data_url(stored.mimetype, mixed or stored.result)
        sources = {"original": _data_url("image/jpeg", stored.original), "anime": anime,
                   "full": _data_url(stored.mimetype, stored.result) if mixed else "",
                   "download": anime,
                   "strength": ""}
    response = make_response(render_page("animegan/result.html", page_context(
        token=token, result=stored, sources=sources, kept=token is not None,
        download_name=_download_name(stored), strength=strength)))
    response.headers["Cache-Control"] = RESULT_CACHE_CONTROL
    return response


def _data_url(mimetype: str, data: bytes) -> str:
    return f"data:{mimetype};base64,{base64.b64encode(data).decode('ascii')}"


def download_wanted(raw: str) -> bool:
    """Whether ``?download=`` asks for an attachment; a value not yes or no is refused."""
    value = parameter_word(raw)
    if value in _YES or value in _NO:
        return value in _YES
    raise BadParameter(f"download must be 1 or 0, got {raw[:20]!r}")


def _download_name(stored: StoredResult) -> str:
    ext = stored.mimetype.split("/")[1]
    return f'anime-{stored.style}.{"jpg" if ext == "jpeg" else ext}'


@blueprint.get("/result/<token>/<any(original, anime):kind>")
def result_image(token: str, kind: str) -> Response:
    download = download_wanted(request.args.get("download", ""))
    strength = parse_strength(request.args.get("strength"))
    stored = get_service().results.get(token)
    if stored is None:
        abort(404, "this result has expired; convert the photo again")
    if kind == "original":
        return file_response(stored.original, "image/jpeg")
    data = stored.result if strength == FULL else _mixed(stored, strength)
    return file_response(data, stored.mimetype, _download_name(stored) if download else None)


def _mixed(stored: StoredResult, strength: int) -> bytes:
    """A stored result at ``strength``, mixed with its stored photo: no inference."""
    with Image.open(io.BytesIO(stored.original)) as original:
        photo = original.convert("RGB")
    try:
        converter = get_service().converter
        label = converter.label(get_service().engine.style(stored.style), strength=strength)
        return converter.remix(stored.result, photo, strength, stored.mimetype.split("/")[1],
                               label)
    except ValueError as exc:  # portrait=faces: the faces alone, not the photo's shape
        raise BadParameter(f"strength cannot apply to this result: {exc}") from exc


def file_response(data: bytes, mimetype: str, attachment: str | None = None) -> Response:
    """A result's bytes, cached privately; ``attachment`` names a download, else inline."""
    response = Response(data, mimetype=mimetype)
    if attachment:
        response.headers["Content-Disposition"] = f'attachment; filename="{attachment}"'
    response.headers["Cache-Control"] = "private, max-age=300"
    return response


@blueprint.post("/convert")
def convert() -> Response:
    received = uploads.receive()
    if received.media is not None and received.media.kind == "still":
        # a photo that runs in tiles: a job, answered 202 as POST /jobs answers (web/jobs.py)
        raise uploads.Queued(uploads.start_job(received.data, received.params, received.media))
    if received.media is not None:
        raise uploads.job_for_convert(received.media)
    conversion = uploads.convert_photo(received)
    response = Response(conversion.data, mimetype=conversion.mimetype)
    response.headers.update({
        "X-Cache": "HIT" if conversion.cache_hit else "MISS",
        "X-AnimeGAN-Style": conversion.style,
        "X-AnimeGAN-Face-Crop": "centre-square" if conversion.face_crop else "none",
        "X-AnimeGAN-Colors": conversion.colors,
        "X-AnimeGAN-Strength": str(conversion.strength),
        "Cache-Control": "no-store",
        "Server-Timing": describe_timings(conversion.timings),
    })
    if conversion.faces is not None:  # portrait mode ran
        response.headers["X-Faces"] = str(conversion.faces)
    if conversion.face_crops:  # the page draws the photo's faces beside the result's
        response.headers["X-AnimeGAN-Face-Crops"] = json.dumps(conversion.face_crops,
                                                                separators=(",", ":"))
    return response


def describe_options(conversion: Conversion) -> str:
    """What portrait mode and the colour option did, for the result page."""
    parts = []
    if conversion.faces == 0:
        parts.append("No face was found" + (": the centre square was converted, as the face "
                                            "styles expect" if conversion.face_crop else ""))
    elif conversion.faces is not None:
        parts.append(f"{conversion.faces} face{'s' if conversion.faces > 1 else ''} found "
                     "and converted on their own")
    if conversion.colors != "off":
        parts.append("the photo's " + ("brightness was" if conversion.colors == "luma"
                                       else "colours were") + " kept")
    return " ".join(sentence(part) for part in parts)


@blueprint.get("/styles")
def styles() -> Response:
    service = get_service()
    return jsonify(default=service.engine.default_style, styles=service.styles_info())


@blueprint.get("/styles/<name>/sample.jpg")
def style_sample(name: str) -> Response:
    service = get_service()
    if not service.settings.sample_size:
        abort(404, "style samples are off (ANIMEGAN_SAMPLE_SIZE = 0)")
    response = Response(service.style_sample(name), mimetype="image/jpeg")
    response.headers["Cache-Control"] = "public, max-age=3600"
    return response


@blueprint.get("/metrics")
def metrics() -> Response:
    service = get_service()
    if service.metrics is None:
        abort(404, "metrics are off; set ANIMEGAN_METRICS = True to serve them")
    body, content_type = service.metrics.exposition()
    return Response(body, content_type=content_type, headers={"Cache-Control": "no-store"})


@blueprint.get("/healthz")
def healthz() -> Response:
    """The status for load balancers; details (ANIMEGAN_HEALTH_DETAILS) for operators."""
    service = get_service()
    who = service.settings.health_details
    show = who == "all" or (who == "local" and is_loopback(client_address()))
    health = service.health(details=show)
    unavailable = health["status"] in ("no_model", "warming")
    response = make_response(jsonify(health), 503 if unavailable else 200)
    if health["status"] == "warming":
        response.headers["Retry-After"] = str(WARMING_RETRY_AFTER)
    return response


def _size(count: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _error_response(message: str, status: int, retry_after: int | None = None) -> Response:
    if request.endpoint in API_ENDPOINTS:
        response = make_response(jsonify(error=message, status=status), status)
    else:
        response = make_response(_error_page(message), status)
    if retry_after is not None:
        response.headers["Retry-After"] = str(retry_after)
    return response


def _error_page(message: str) -> str:
    """The form with the error, in the site's layout, else (it may be what broke) ours or bare:
    ours through Flask's own renderer, in case the site's is what broke."""
    for layout in (None, BUILT_IN_BASE):
        try:
            if layout is None:
                return render_page("animegan/index.html", page_context(error=message))
            return render_template("animegan/index.html",
                                   animegan=page_context(layout=layout, error=message))
        except Exception:  # noqa: BLE001 - an error page must not fail
            log.exception("flask_animegan: the error page could not be rendered with %s",
                          "the site's layout" if layout is None else BUILT_IN_BASE)
    return (f'<!doctype html><html lang="en"><title>Photo to anime</title>'
            f'<p role="alert">{escape(sentence(message))}</p></html>')


@blueprint.errorhandler(ConversionError)
def conversion_error_response(error: ConversionError) -> Response:
    if request.endpoint in LIMITED_ENDPOINTS:
        uploads.log_conversion(error.status, error=error.__class__.__name__)
    response = _error_response(str(error), error.status, error.retry_after)
    if isinstance(error, uploads.SendElsewhere) and response.is_json:
        response.set_data(json.dumps({**response.get_json(), **error.urls}))
    return response


@blueprint.errorhandler(RateLimitExceeded)
def _rate_limited(error: RateLimitExceeded) -> Response:
    service = get_service()
    if service.metrics is not None:
        service.metrics.rate_limited.inc()
    current = service.limiter.current_limit
    window = _window(current) if current is not None else None
    # without the window (its storage failed), the limit's own period
    wait = (max(1, int(window[1] - time.time())) if window is not None
            else max(1, int(error.limit.limit.get_expiry())))
    return _error_response(f"too many conversions from your address (limit: {error.description});"
                           f" try again in {wait} s", 429, wait)


@blueprint.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> Response:
    limit = get_service().settings.max_upload_bytes
    if csrf.is_host_refusal(error):  # Flask-WTF's CSRFError: the same words as ours
        return conversion_error_response(csrf.CsrfFailed(csrf.REFUSED))
    if (error.code == 413 and request.mimetype == "multipart/form-data"
            and request.content_length is not None and request.content_length <= limit):
        message = (f"the form has more than {MAX_FORM_PARTS} parts or a text field is too "
                   "large; send only the fields image, style, size, format, colors, portrait "
                   "and csrf_token")
    elif error.code == 413:
        message = f"the upload is too large; the limit is {_size(limit)}"
    else:
        message = error.description or error.name
    return _error_response(message, error.code or 500)


# Flask tries the app's code handlers before the blueprint's class handlers, so a site's
# app_errorhandler(404) would answer our abort(404)s: register ours for every code.
for _code in default_exceptions:
    blueprint.register_error_handler(_code, _http_error)


@blueprint.errorhandler(Exception)
def _unexpected(error: Exception) -> NoReturn:
    """Re-raise a bug so Flask logs it and answers with our 500 handler; otherwise a
    site's ``errorhandler(Exception)`` would answer it first."""
    raise error
