"""The blueprint's OpenAPI 3.1 document at ``<prefix>/openapi.json``, built from the URL
map: a route without a description raises, so the two cannot drift."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from flask import Response, current_app, jsonify, request

from ..config import OUTPUT_FORMATS
from ..convert.colors import COLOR_MODES
from ..convert.costs import COST_RULE
from ..convert.request import PORTRAIT_MODES
from ..convert.strength import FULL
from ..service import get_service
from .blueprint import blueprint
from .uploads import UPLOAD_TYPES

_ERROR = {"$ref": "#/components/responses/Error"}
_BUSY = {"$ref": "#/components/responses/Busy"}
_LIMITED = {"$ref": "#/components/responses/RateLimited"}
_HTML: dict[str, Any] = {"description": "An HTML page", "content": {"text/html": {"schema": {"type": "string"}}}}
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_JPEG = {"image/jpeg": _BINARY}
_IMAGES = {f"image/{fmt}": _BINARY for fmt in OUTPUT_FORMATS}
_ANIMATIONS = {mime: _BINARY
               for mime in ("image/gif", "image/webp", "image/png", "image/apng", "video/mp4")}
#: A page's 404: the page with the error, or (a path no route matches) the JSON error.
_PAGE_404 = {"description": "Not found: the page, or the JSON error for an unknown path",
             "content": {**_HTML["content"], "application/json": {
                 "schema": {"$ref": "#/components/schemas/Error"}}}}
_RATE_HEADERS = {name: {"$ref": f"#/components/headers/{name}"}
                 for name in ("X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset")}
_REFUSALS = {"400": _ERROR, "404": _ERROR, "408": _ERROR, "413": _ERROR, "415": _ERROR,
             "429": _LIMITED, "503": _BUSY}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    # an empty value is the same as none (an HTML form sends one for a blank choice)
    return {"name": name, "in": "query", "required": False, "allowEmptyValue": True,
            "schema": schema, "description": description}


def _any_case(words: Iterable[str]) -> dict[str, Any]:
    """One of ``words`` in any case, spaces around, as the service reads it."""
    spelled = ("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c)
                       for c in word) for word in words)
    return {"type": "string", "pattern": f"^[ \\t]*(?:{'|'.join(spelled)})[ \\t]*$"}


def _path(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True,
            "schema": schema or {"type": "string"}}


def _conversion_parameters() -> list[dict[str, Any]]:
    service = get_service()
    largest, side = service.sizes.photo, service.sizes.default
    installed = service.engine.styles
    licences = {name: {"licence": style.licence, "url": style.licence_url}
                for name, style in sorted(installed.items())}
    style = _query("style", {"type": "string", "enum": sorted(installed)},
                   "An installed style (GET /styles); unset: the default style. Licences: "
                   + "; ".join(f"{name} {entry['licence']}"
                               + (f" <{entry['url']}>" if entry["url"] else "")
                               for name, entry in licences.items()))
    return [
        {**style, "x-licences": licences},
        _query("size", {"type": "integer", "minimum": 16, "maximum": largest},
               f"Long side of the output in pixels; unset: {side}. Over "
               f"{side}, it costs ceil((size / {side})^2) conversions "
               "of the rate limit"),
        _query("format", _any_case(["jpeg", "jpg", *OUTPUT_FORMATS[1:]]),
               "Output format; unset: ANIMEGAN_OUTPUT_FORMAT"),
        _query("colors", _any_case(COLOR_MODES),
               "off: the style's colours; luma: the photo's brightness; keep: its colours"),
        _query("portrait", _any_case(PORTRAIT_MODES),
               "Portrait mode: faces converted on their own (docs/portrait.md)"),
        _strength(),
    ]


def _strength() -> dict[str, Any]:
    return _query("strength", {"type": "integer", "minimum": 0, "maximum": FULL},
                  f"Percent of the style, whole; unset: {FULL}. Mixed with the photo after "
                  "the full-strength result, which the cache keeps: another strength of "
                  "a cached photo is a hit (docs/http-api.md, Strength)")


def _upload_body(form_fields: bool = True) -> dict[str, Any]:
    multipart: dict[str, Any] = {"type": "object", "required": ["image"],
                                 "properties": {"image": _BINARY["schema"]}}
    if form_fields:
        for name in ("style", "size", "format", "colors", "portrait", "strength"):
            multipart["properties"][name] = {"type": "string"}
    # the raw body: any of the page's types (the content decides what it is), or none
    return {"required": True, "content": {
        "multipart/form-data": {"schema": multipart},
        "application/octet-stream": _BINARY, **{mime: _BINARY for mime in UPLOAD_TYPES},
    }}


def _job(description: str, status: str = "200", **extra: Any) -> dict[str, Any]:
    return {status: {"description": description, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}, **extra}}


def _operations() -> dict[tuple[str, str], dict[str, Any]]:
    """What each (endpoint, method) of the blueprint takes and answers."""
    conversion = _conversion_parameters()
    token = _path("token")
    job_id = _path("job_id")
    download = _query("download", _any_case(["1", "0", "true", "false", "yes", "no", "on",
                                          "off"]),
                      "1: as an attachment (Content-Disposition)")
    return {
        ("animegan.index", "get"): {
            "summary": "The upload page", "tags": ["pages"],
            "responses": {"200": _HTML}},
        ("animegan.upload", "post"): {
            "summary": "The page's form: converts the photo, 303 to its result page",
            "tags": ["pages"], "requestBody": _upload_body(),
            "responses": {"303": {"description": "To the result page (or a job's page)"},
                          "200": _HTML, **{code: {"description": "The form with the error",
                                                  "content": _HTML["content"]}
                                           for code in ("400", "404", "408", "413", "415")},
                          "429": {"description": "Too many conversions", "headers": {
                              "Retry-After": {"$ref": "#/components/headers/Retry-After"}},
                              "content": _HTML["content"]},
                          "503": {"description": "Busy", "headers": {
                              "Retry-After": {"$ref": "#/components/headers/Retry-After"}},
                              "content": _HTML["content"]}}},
        ("animegan.result", "get"): {
            "summary": "A result page", "tags": ["pages"], "parameters": [token, _strength()],
            "responses": {"200": _HTML, "404": _PAGE_404,
                          "400": {"description": "The upload page with the error",
                                  "content": _HTML["content"]}}},
        ("animegan.result_image", "get"): {
            "summary": "A result page's picture: the photo as sent, or the anime one",
            "tags": ["pages"],
            "parameters": [token, _path("kind", {"type": "string",
                                                 "enum": ["original", "anime"]}), download,
                           _strength()],
            "responses": {"200": {"description": "The picture", "content": _IMAGES},
                          "400": {"description": "The upload page with the error",
                                  "content": _HTML["content"]}, "404": _PAGE_404}},
        ("animegan.convert", "post"): {
            "summary": "Convert a photo; answers the picture", "tags": ["api"],
            "description": "The photo as multipart/form-data (field `image`, parameters in "
                           "the form or the query) or as the raw body (parameters in the "
                           "query), with its own Content-Type or application/octet-stream. "
                           "An animation or a video is a 415 with `jobs_url`; a photo "
                           "that runs in tiles (a size above ANIMEGAN_MAX_SIDE and 512) is a "
                           "job: 202 with the job, as POST /jobs answers.",
            "parameters": conversion, "requestBody": _upload_body(form_fields=False),
            "responses": {"200": {"description": "The converted picture",
                                  "headers": {**_RATE_HEADERS,
                                              "X-Cache": {"schema": {"type": "string",
                                                                     "enum": ["HIT", "MISS"]}},
                                              "X-AnimeGAN-Style": {"schema": {"type": "string"}},
                                              "X-AnimeGAN-Strength": {"schema": {
                                                  "type": "integer", "minimum": 0,
                                                  "maximum": FULL}}},
                                  "content": _IMAGES},
                          **_job("A photo that runs in tiles, queued as a job", "202",
                                 headers={"Location": {"schema": {"type": "string"}}}),
                          **_REFUSALS}},
        ("animegan.styles", "get"): {
            "summary": "The styles: installed and pullable", "tags": ["api"],
            "responses": {"200": {"description": "The styles", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Styles"}}}}}},
        ("animegan.style_sample", "get"): {
            "summary": "A style's sample picture", "tags": ["api"],
            "parameters": [_path("name", {"type": "string",
                                          "enum": sorted(get_service().engine.styles)})],
            "responses": {"200": {"description": "A JPEG", "content": _JPEG},
                          "404": _ERROR, "503": _BUSY}},
        ("animegan.metrics", "get"): {
            "summary": "Prometheus metrics (ANIMEGAN_METRICS)", "tags": ["operations"],
            "responses": {"200": {"description": "Prometheus text format", "content": {
                "text/plain": {"schema": {"type": "string"}}}}, "404": _ERROR}},
        ("animegan.healthz", "get"): {
            "summary": "Health for load balancers", "tags": ["operations"],
            "responses": {code: {"description": text, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Health"}}},
                **({"headers": {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}}
                   if code == "503" else {})}
                for code, text in (("200", "Serving"), ("503", "Warming up, or no style"))}},
        ("animegan.openapi", "get"): {
            "summary": "This document", "tags": ["operations"],
            "responses": {"200": {"description": "OpenAPI 3.1", "content": {
                "application/json": {"schema": {"type": "object"}}}}}},
        ("animegan.create_job", "post"): {
            "summary": "Convert an animation, a video or a photo that runs in tiles as a "
                       "background job", "tags": ["jobs"],
            "description": "The file as multipart/form-data (field `image`, parameters in "
                           "the form or the query) or as the raw body with its own "
                           "Content-Type (`video/mp4`, `image/gif`, ...) or "
                           "`application/octet-stream` (parameters in the query); any other "
                           "type is a 415. A still photo that does not run in tiles is a 415 "
                           "with `convert_url`.",
            "parameters": conversion,
            "requestBody": _upload_body(form_fields=False),
            "responses": {**_job("Queued", "202", headers={
                "Location": {"schema": {"type": "string"}}}), **_REFUSALS}},
        ("animegan.job", "get"): {
            "summary": "A job's state and progress", "tags": ["jobs"], "parameters": [job_id],
            "responses": {**_job("The job"), "404": _ERROR, "503": _BUSY}},
        ("animegan.cancel_job", "delete"): {
            "summary": "Cancel a job", "tags": ["jobs"], "parameters": [job_id],
            "responses": {**_job("Cancelled"), **_job("Stopping", "202"), "404": _ERROR,
                          "409": _ERROR, "503": _BUSY}},
        ("animegan.job_result", "get"): {
            "summary": "A finished job's result", "tags": ["jobs"],
            "parameters": [job_id, download],
            "responses": {"200": {"description": "The result", "content": _ANIMATIONS},
                          "400": _ERROR, "404": _ERROR, "409": _ERROR, "503": _BUSY}},
        ("animegan.job_preview", "get"): {
            "summary": "A finished job's preview (its first frame)", "tags": ["jobs"],
            "parameters": [job_id],
            "responses": {"200": {"description": "A JPEG", "content": _JPEG},
                          "404": _ERROR, "409": _ERROR, "503": _BUSY}},
        ("animegan.job_partial", "get"): {
            "summary": "The part of a running video converted so far, to watch while the "
                       "rest converts", "tags": ["jobs"],
            "description": "A video job converts in segments of two seconds; this joins "
                           "the first `segments` finished ones (all, if not given) with "
                           "their audio, as the job's `partial_url` gives it. Ranges are "
                           "served. Once the job is done: 303 to its result.",
            "parameters": [job_id, {"name": "segments", "in": "query", "required": False,
                                    "schema": {"type": "integer", "minimum": 1}}],
            "responses": {"200": {"description": "An MP4", "content": {
                "video/mp4": {"schema": {"type": "string", "format": "binary"}}}},
                "206": {"description": "The range asked for", "content": {
                    "video/mp4": {"schema": {"type": "string", "format": "binary"}}}},
                "303": {"description": "The job is done: its result",
                        "headers": {"Location": {"schema": {"type": "string"}}}},
                "400": _ERROR, "404": _ERROR, "409": _ERROR, "416": _ERROR, "503": _BUSY}},
        ("animegan.job_page", "get"): {
            "summary": "A job's page, refreshing itself until the result shows",
            "tags": ["pages"], "parameters": [job_id],
            "responses": {"200": _HTML, "404": _PAGE_404,
                          "503": {"description": "The job store is out of reach; the job "
                                                 "is kept", "headers": {
                              "Retry-After": {"$ref": "#/components/headers/Retry-After"}},
                              "content": _HTML["content"]}}},
    }


_COMPONENTS: dict[str, Any] = {
    "schemas": {
        "Error": {"type": "object", "required": ["error", "status"], "properties": {
            "error": {"type": "string", "description": "What went wrong and what to do"},
            "status": {"type": "integer"},
            "jobs_url": {"type": "string", "description": "Send an animation here instead"},
            "convert_url": {"type": "string", "description": "Send a still photo here"},
            "login_url": {"type": "string", "description": "The site's login page (401)"}}},
        "Styles": {"type": "object", "required": ["default", "styles"], "properties": {
            "default": {"type": ["string", "null"]},
            "styles": {"type": "array", "items": {"type": "object", "required": [
                "name", "installed"], "properties": {
                    "name": {"type": "string"}, "installed": {"type": "boolean"},
                    "licence": {"type": "string", "description": (
                        "SPDX licence identifier, LicenseRef-AnimeGANv2-NonCommercial (the "
                        "original AnimeGANv2 weights: non-commercial use only), or own (a "
                        "file put into the models folder)")},
                    "licence_url": {"type": ["string", "null"], "format": "uri"},
                    "licence_note": {"type": "string"}}}}}},
        "Health": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "string"}}},
        "Job": {"type": "object", "required": ["id", "state", "url"], "properties": {
            "id": {"type": "string"},
            "state": {"type": "string",
                      "enum": ["queued", "running", "done", "failed", "cancelled"]},
            "kind": {"type": "string", "enum": ["animation", "video", "photo"]},
            "tiles_done": {"type": "integer", "description": "A photo's tiles converted"},
            "tiles_total": {"type": "integer"},
            "progress": {"type": "number"}, "url": {"type": "string"},
            "result_url": {"type": ["string", "null"]},
            "segments_done": {"type": "integer",
                              "description": "A video's segments converted and kept"},
            "segments_total": {"type": ["integer", "null"]},
            "partial_url": {"type": ["string", "null"], "description": (
                "A running video's part converted so far (null before its first "
                "segment, and once it has ended)")}}},
    },
    "headers": {
        "Retry-After": {"description": "Seconds to wait before trying again",
                        "schema": {"type": "string", "pattern": "^[0-9]+$"}},
        "X-RateLimit-Limit": {"schema": {"type": "string"}},
        "X-RateLimit-Remaining": {"schema": {"type": "string"},
                                  "description": "Conversions left in the window"},
        "X-RateLimit-Reset": {"schema": {"type": "string"}},
    },
    "responses": {
        "Error": {"description": "Refused: the JSON error", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
        "Busy": {"description": "Busy (the queue is full) or warming up",
                 "headers": {"Retry-After": {"$ref": "#/components/headers/Retry-After"}},
                 "content": {"application/json": {"schema": {
                     "$ref": "#/components/schemas/Error"}}}},
        "RateLimited": {"description": f"Too many conversions from this client ({COST_RULE})",
                        "headers": {"Retry-After": {"$ref": "#/components/headers/Retry-After"},
                                    **_RATE_HEADERS},
                        "content": {"application/json": {"schema": {
                            "$ref": "#/components/schemas/Error"}}}},
    },
}
_CONVERTER = re.compile(r"<(?:[a-z]+(?:\([^)]*\))?:)?(\w+)>")


def openapi_path(rule: str) -> str:
    """A Werkzeug rule as an OpenAPI path: ``/r/<token>`` -> ``/r/{token}``."""
    return _CONVERTER.sub(r"{\1}", rule)


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the blueprint's routes in the current app."""
    operations = _operations()
    paths: dict[str, dict[str, Any]] = {}
    for rule in current_app.url_map.iter_rules():
        if not rule.endpoint.startswith(f"{blueprint.name}.") or rule.endpoint.endswith(
                ".static"):
            continue
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            operation = operations[(rule.endpoint, method.lower())]
            paths.setdefault(openapi_path(rule.rule), {})[method.lower()] = {
                "operationId": f"{rule.endpoint.split('.', 1)[1]}_{method.lower()}",
                **operation}
    return {"openapi": "3.1.0",
            "info": {"title": "flask-animegan", "version": "1",
                     "description": "Photos to anime pictures (docs/http-api.md)"},
            # relative to where the app is mounted (SCRIPT_NAME)
            "servers": [{"url": request.script_root or "/"}],
            "paths": dict(sorted(paths.items())), "components": _COMPONENTS}


@blueprint.get("/openapi.json")
def openapi() -> Response:
    response = jsonify(document())
    response.headers["Cache-Control"] = "no-cache"
    return response
