"""Uploads at the door: read once, checked, and routed to a photo conversion or a job."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import request, url_for
from werkzeug.exceptions import RequestEntityTooLarge

from ..config import FRAMES_PER_CONVERSION
from ..convert.converter import Conversion
from ..convert.request import ConvertRequest
from ..errors import BadImage, ConversionError, Overloaded, UnsupportedImage
from ..inputs.media import MediaInfo
from ..jobs.queues import FULL_RETRY_AFTER
from ..jobs.records import JobRecord
from ..service import get_service
from .clients import CONVERSIONS_SCOPE, client_key
from .limits import charge, charge_pixels

log = logging.getLogger("flask_animegan")
_RAW_BODY_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")


class SendElsewhere(UnsupportedImage):
    """An upload sent to the wrong door; ``urls`` say where to send it (animegan.js follows)."""

    def __init__(self, message: str, **urls: str) -> None:
        super().__init__(message)
        self.urls = urls


class TooManyJobs(ConversionError):
    """The client has too many unfinished jobs, or too few conversions left for the frames."""

    status = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Upload:
    """A request's file and parameters, checked as a photo's, and where it goes."""

    data: bytes
    params: Mapping[str, Any]
    request: ConvertRequest
    media: MediaInfo | None  # an animation or a video: a job; None: a photo


def receive() -> Upload:
    """Read the upload, check its parameters before anything costs CPU, and route it."""
    data, params = read_upload()
    parsed = get_service().parse(params)
    return Upload(data, params, parsed, get_service().route(data))


def read_upload() -> tuple[bytes, Any]:
    """The file's bytes and the parameters: multipart (field ``image``) or the raw body."""
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("image")
        if upload is None:
            raise BadImage("no image: send the photo in the multipart field 'image'")
        return upload.read(), request.values
    if (request.mimetype not in _RAW_BODY_TYPES
            and not request.mimetype.startswith(("image/", "video/"))):
        raise UnsupportedImage(f"Content-Type {request.mimetype} is not an image or a video; "
                               "send multipart/form-data with field 'image' or the raw file")
    data = request.get_data(cache=False)
    if len(data) > get_service().settings.max_upload_bytes:  # a chunked body past the limit
        raise RequestEntityTooLarge()
    if not data:
        raise BadImage("no image: send multipart/form-data with the photo in field 'image', "
                       "or the raw image as the request body")
    return data, request.args


def convert_photo(upload: Upload) -> Conversion:
    """Convert a routed photo upload (or answer it from the cache)."""
    service = get_service()
    conversion = service.convert_upload(upload.data, upload.request,
                                        client=client_key(service.limiter))
    if conversion.cache_hit:
        charge(0)  # no inference
    else:
        charge_pixels(conversion.size)
    log_conversion(200, conversion)
    if service.metrics is not None:
        service.metrics.conversion_done(conversion, service.cache.enabled,
                                        service.cache.stats().get("bytes"))
    return conversion


def log_conversion(status: int, conversion: Conversion | None = None,
                   error: str | None = None) -> None:
    """One structured line per conversion: no image content, no client file names."""
    record: dict[str, Any] = {"endpoint": request.endpoint, "status": status}
    if conversion is not None:
        record.update(style=conversion.style, size=list(conversion.size),
                      format=conversion.format,
                      cache="hit" if conversion.cache_hit else "miss", ms=conversion.timings)
    if error is not None:
        record["error"] = error
    log.info("animegan.conversion %s", json.dumps(record, sort_keys=True))


def job_for_convert(info: MediaInfo) -> SendElsewhere:
    """The refusal of an animation or a video sent to ``/convert``: where to send it."""
    what = "a video" if info.kind == "video" else f"an animated {info.format}"
    return SendElsewhere(
        f"this is {what} ({info.frames} frames): converting it takes a while, so it runs "
        f"as a job; send it to POST {url_for('.create_job')} and follow the job's URL for "
        "its progress", jobs_url=url_for(".create_job"))


def _charge_frames(info: MediaInfo) -> None:
    """Count a job's frames as ``ceil(frames / N)`` conversions against the rate limit
    (one of them flask-limiter's, after the view); TooManyJobs, costing none, if they do
    not fit."""
    service = get_service()
    cost = math.ceil(info.frames / FRAMES_PER_CONVERSION)
    if cost <= 1:
        return
    for counted in service.limiter.current_limits:
        if not (counted.shared and counted.request_args[-1] == CONVERSIONS_SCOPE):
            continue
        item, args = counted.limit, counted.request_args
        try:
            fits = counted.limiter.test(item, *args, cost=cost)
            if fits:
                counted.limiter.hit(item, *args, cost=cost - 1)
        except Exception:  # a host Limiter's storage failed: as its headers do
            log.warning("flask_animegan: a job's frames could not be counted against the "
                        "rate limit", exc_info=True)
            return
        if not fits:
            wait = max(1, int(item.get_expiry()))
            what = (f"{info.frames} frames count as {cost} conversions "
                    f"({FRAMES_PER_CONVERSION} frames each)")
            if cost > item.amount:
                raise TooManyJobs(f"this file is too long for the rate limit: its {what}, "
                                  f"more than the limit of {item}; send a shorter clip",
                                  wait)
            raise TooManyJobs(f"too many conversions from your address: this file's {what}"
                              f" and the limit of {item} has fewer left; try again in "
                              f"{wait} s", wait)


def start_job(data: bytes, params: Mapping[str, Any], info: MediaInfo | None = None) -> JobRecord:
    """Check an upload at the door and queue its job; ``info``: its probe, if made already."""
    service = get_service()
    jobs = service.jobs
    if jobs is None:
        raise UnsupportedImage("animations and videos are off in this app; send a photo")
    parsed = service.parse(params, media=True)
    if info is None:
        info = jobs.probe(data)
    if info.kind == "still":
        raise SendElsewhere(
            "this is a still photo, not an animation or a video: send it to POST "
            f"{url_for('.convert')}, which converts it at once", convert_url=url_for(".convert"))
    client = client_key(service.limiter)
    unfinished = jobs.unfinished(client)
    cap = service.settings.jobs_per_client
    if unfinished >= cap:
        # the form's user has no DELETE to send: the page can only ask them to wait
        way = ("" if request.endpoint == "animegan.upload"
               else ", or cancel one with DELETE on its URL")
        raise TooManyJobs(f"you already have {unfinished} unfinished jobs (the limit is "
                          f"{cap}); wait for one to finish{way}", retry_after=5)
    waiting = jobs.queue.queued_count()
    if waiting >= service.settings.job_max_queue:
        # before the frames are counted: a full queue costs the client one request
        raise Overloaded(f"the job queue is full ({waiting} jobs are waiting for a "
                         f"worker); try again in {FULL_RETRY_AFTER} s", FULL_RETRY_AFTER)
    _charge_frames(info)
    charge(1)  # the rest of the frames' conversions, taken by _charge_frames
    record = jobs.submit(data, info, style=parsed.style.name, size=parsed.size,
                         client=client, colors=parsed.options.colors,
                         strength=parsed.options.strength)
    log.info("animegan.job %s", json.dumps(
        {"event": "queued", "kind": info.kind, "format": info.format, "frames": info.frames,
         "style": parsed.style.name, "size": parsed.size}, sort_keys=True))
    return record


