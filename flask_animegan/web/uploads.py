"""Uploads at the door: read once, checked, and routed to a photo conversion or a job."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import g, request, url_for
from werkzeug.exceptions import RequestEntityTooLarge

from ..config import FRAMES_PER_CONVERSION
from ..convert.converter import Conversion
from ..convert.costs import frames_cost
from ..convert.request import ConvertRequest
from ..errors import BadImage, ConversionError, Overloaded, UnsupportedImage
from ..inputs.media import MediaInfo
from ..jobs.queues import FULL_RETRY_AFTER
from ..jobs.records import JobRecord
from ..service import get_service
from .clients import CONVERSIONS_SCOPE, client_key
from .limits import charge, charge_pixels, largest_charge, pixel_cost

log = logging.getLogger("flask_animegan")
#: The files the page's picker offers and the OpenAPI document lists for /convert and
#: /jobs alike: photos, animations and videos. The content decides the format and the
#: route (a moving file to /convert is told to use /jobs, a still sent to /jobs the reverse).
UPLOAD_TYPES = ("image/jpeg", "image/png", "image/apng", "image/webp", "image/gif",
                "image/bmp", "image/tiff", "video/mp4", "video/webm", "video/quicktime",
                "video/x-matroska")
#: What the picker offers by name too: browsers give some videos no type or another one.
VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv")
#: The picker's ``accept`` attribute.
PICKER_ACCEPT = ",".join(UPLOAD_TYPES + VIDEO_EXTENSIONS)
#: Raw bodies whose type names no format (curl's ``--data-binary`` sends the last one).
_RAW_BODY_TYPES = ("", "application/octet-stream", "application/x-www-form-urlencoded")


def raw_body_accepted(mimetype: str) -> bool:
    """The one rule for a raw body's Content-Type, on /convert and /jobs: a type that
    names no format, or any image or video type (:data:`UPLOAD_TYPES` and the ones a
    client may spell otherwise); the content is read to tell what it is."""
    return mimetype in _RAW_BODY_TYPES or mimetype.startswith(("image/", "video/"))


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
    media: MediaInfo | None  # an animation, a video or a photo in tiles: a job; None: a photo


class Queued(Exception):  # an answer, not an error
    """A job was made of the upload: web/jobs.py answers with it (202), as POST /jobs does."""

    def __init__(self, record: JobRecord) -> None:
        super().__init__(record.id)
        self.record = record


def receive() -> Upload:
    """Read the upload, check its parameters before anything costs CPU, and route it."""
    data, params = read_upload()
    parsed = get_service().parse(params)
    return Upload(data, params, parsed, get_service().route(data, parsed))


def read_upload() -> tuple[bytes, Any]:
    """The file's bytes and the parameters: multipart (field ``image``) or the raw body;
    once it has arrived, the upload counts against the admission (503 when full)."""
    data, params = _read_body()
    # after the body: a client still sending (or trickling) holds no conversion's place
    reading = g.pop("animegan_reading", None)
    if reading is not None:
        reading.leave()
    g.animegan_admission = get_service().admission.enter()
    return data, params


def _read_body() -> tuple[bytes, Any]:
    if request.mimetype == "multipart/form-data":
        upload = request.files.get("image")
        if upload is None:
            raise BadImage("no image: send the photo in the multipart field 'image'")
        return upload.read(), request.values
    if not raw_body_accepted(request.mimetype):
        raise UnsupportedImage(
            f"Content-Type {request.mimetype} is not an image or a video: send the raw file "
            f"with its own type ({', '.join(UPLOAD_TYPES)}) or application/octet-stream, or "
            "multipart/form-data with the file in field 'image'")
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
        charge_pixels(conversion.size, conversion.faces or 0)
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


def _charge_job(cost: int, what: str, shorter: str) -> list[str]:
    """Count a job as ``cost`` conversions against the rate limit (one of them
    flask-limiter's, after the view); TooManyJobs, costing none, if they do not fit.
    The limit's key of the client, where a worker charges more (empty: not counted)."""
    service = get_service()
    key: list[str] = []
    for counted in service.limiter.current_limits:
        if not (counted.shared and counted.request_args[-1] == CONVERSIONS_SCOPE):
            continue
        item, args = counted.limit, counted.request_args
        key = [str(arg) for arg in args]
        if cost <= 1:
            continue
        try:
            fits = counted.limiter.test(item, *args, cost=cost)
            if fits:
                counted.limiter.hit(item, *args, cost=cost - 1)
        except Exception:  # a host Limiter's storage failed: as its headers do
            log.warning("flask_animegan: a job could not be counted against the rate limit",
                        exc_info=True)
            return key
        if not fits:
            wait = max(1, int(item.get_expiry()))
            if cost > item.amount:
                raise TooManyJobs(f"this file is too large for the rate limit: {what}, more "
                                  f"than the limit of {item}; {shorter}", wait)
            raise TooManyJobs(f"too many conversions from your address: {what} and the "
                              f"limit of {item} has fewer left; try again in {wait} s", wait)
    return key


def start_job(data: bytes, params: Mapping[str, Any], info: MediaInfo | None = None) -> JobRecord:
    """Check an upload at the door and queue its job: an animation, a video, or a photo
    that runs in tiles; ``info``: its probe, if made already."""
    service = get_service()
    jobs = service.jobs
    if jobs is None:
        raise UnsupportedImage("animations and videos are off in this app; send a photo")
    # a photo may ask for more than a frame: its own parse comes first, the frames' below
    parsed = service.parse(params)
    if info is None:
        info = jobs.probe(data)
    tiles = 0
    if info.kind == "still":
        tiles = service.converter.tiles_for((info.width, info.height), parsed)
        if not tiles:
            raise SendElsewhere(
                "this is a still photo, not an animation or a video: send it to POST "
                f"{url_for('.convert')}, which converts it at once",
                convert_url=url_for(".convert"))
    else:
        parsed = service.parse(params, media=True)
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
    if tiles:
        # a photo job costs what the same photo costs through /convert: its pixels
        width, height = service.converter.fitted_for((info.width, info.height), parsed)
        cost = pixel_cost((width, height))
        key = _charge_job(cost, f"a {width}×{height} picture counts as {cost} conversions",
                          "ask for a smaller size")
    elif info.frames:
        cost = frames_cost(info.frames)  # more is taken as the frames decoded pass it
        key = _charge_job(cost, f"its {info.frames} frames count as {cost} conversions "
                                f"({FRAMES_PER_CONVERSION} frames each)", "send a shorter clip")
    else:
        # no count and no duration: the most the limits allow, the unused given back
        cost = min(frames_cost(service.settings.max_frames), largest_charge())
        key = _charge_job(cost, f"a video whose header gives no length counts as {cost} "
                                "conversions until its frames are counted",
                          "send a file with a duration in its header")
    charge(1)  # the rest of the job's conversions, taken by _charge_job
    record = jobs.submit(data, info, style=parsed.style.name, size=parsed.size,
                         client=client, colors=parsed.options.colors,
                         output_format=parsed.format, portrait=parsed.options.portrait,
                         tiles=tiles, strength=parsed.options.strength, charge_key=key,
                         charged=max(1, cost) if key else 0)
    log.info("animegan.job %s", json.dumps(
        {"event": "queued", "kind": record.kind, "format": info.format, "frames": info.frames,
         "tiles": tiles, "style": parsed.style.name, "size": parsed.size}, sort_keys=True))
    return record
