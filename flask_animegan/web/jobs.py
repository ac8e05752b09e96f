"""The job API and page: animations and videos converted in the background.

``POST /jobs`` takes an upload as ``/convert`` does (multipart field ``image`` or the raw
body; ``style``, ``size``, ``format``), probes it in a helper process, checks the limits
at the door and answers ``202`` with ``Location: /jobs/<id>``; ``GET`` on that URL tells
the job's state and progress, ``DELETE`` cancels it, ``/result`` and ``/preview`` serve
what it made and ``/page`` is a page that refreshes itself until the result shows (no
JavaScript needed). A job is found only by its id (24 random bytes): nothing lists jobs.

At the door, before anything is stored:

* a still photo is refused (415) with a pointer to ``/convert``, which converts it at once;
* a client (the rate limit's key) has at most ANIMEGAN_JOBS_PER_CLIENT unfinished jobs
  (429);
* a full queue (ANIMEGAN_JOB_MAX_QUEUE waiting) answers 503 with Retry-After;
* a job counts against ANIMEGAN_RATE_LIMIT as ceil(frames / ANIMEGAN_FRAMES_PER_CONVERSION)
  conversions: the limit's own check counted one before the view, the rest are added here
  through flask-limiter's public API (the same limit item and key, web/limits.py), after a
  test that they fit, so a refused job costs one.

An animation or a video sent to ``/convert`` gets 415 with ``jobs_url``; sent with the
form (``/upload``), it becomes a job and the browser is sent to its page (views.NeedsJob).
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from typing import Any

from flask import (
    Response,
    abort,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.wrappers import Response as BaseResponse

from ..config import FRAMES_PER_CONVERSION
from ..errors import BadParameter, ConversionError, Overloaded, UnsupportedImage
from ..inputs.media import MediaInfo
from ..jobs.queues import FULL_RETRY_AFTER
from ..jobs.records import JobRecord, JobState
from ..jobs.work import Jobs
from ..service import get_service
from . import csrf, views
from .blueprint import blueprint
from .clients import CONVERSIONS_SCOPE, client_key
from .limits import spending

log = logging.getLogger("flask_animegan")
#: Seconds the page waits before it refreshes itself, and the script between polls.
PAGE_REFRESH_S = 2
#: What a job result is called when downloaded, by MIME type.
_EXTENSIONS = {"image/gif": "gif", "image/webp": "webp", "image/png": "png",
               "image/apng": "png", "video/mp4": "mp4"}
_NOT_FOUND = "no such job: it has expired or never existed; send the file again"
_exempted: weakref.WeakSet[Any] = weakref.WeakSet()


class TooManyJobs(ConversionError):
    """The client's unfinished jobs are at ANIMEGAN_JOBS_PER_CLIENT, or the job's frames
    are more conversions than its rate limit has left."""

    status = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class JobNotReady(ConversionError):
    """The job has no result (yet), or has ended and cannot be cancelled."""

    status = 409


class StillForJob(UnsupportedImage):
    """A still photo sent to ``POST /jobs``: ``/convert`` converts it at once."""


@blueprint.url_value_preprocessor
def _exempt_api_from_host_csrf(endpoint: str | None, values: dict[str, Any] | None) -> None:
    # the job API reads no cookie, as /convert (csrf.py says why that is safe); DELETE
    # needs the job's id, which only its creator has
    protect = csrf.host_protect()
    if protect is not None and protect not in _exempted:
        protect.exempt(create_job)
        protect.exempt(cancel_job)
        _exempted.add(protect)


# -- at the door ---------------------------------------------------------------------
def _conversions(frames: int) -> int:
    return max(1, math.ceil(frames / FRAMES_PER_CONVERSION))


def _charge_frames(info: MediaInfo) -> None:
    """Count the job's frames against the conversions' rate limit: ``ceil(frames / N)``
    conversions, one of which flask-limiter takes after the view (it tested that one
    before it). Raises TooManyJobs, costing nothing more than that one, when they do not
    fit in what is left."""
    service = get_service()
    cost = _conversions(info.frames)
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


def start_job(data: bytes, params: Any, info: MediaInfo | None = None) -> JobRecord:
    """Check an upload at the door and queue its job; the new JobRecord.

    ``info`` is the upload's probe when the caller made it already."""
    service = get_service()
    style = service.engine.style(params.get("style") or None).name
    size = service.parse_size(params.get("size"))
    # checked as /convert checks it; the result keeps the upload's kind (GIF -> GIF,
    # video -> MP4) and the preview is a JPEG
    service.parse_format(params.get("format"))
    options = service.parse_options(params.get("colors"), params.get("portrait"))
    if options.portrait in ("on", "faces"):
        raise BadParameter("portrait mode is for photos: a job converts each frame as a "
                           "whole; leave portrait out (or send portrait=off)")
    spending()  # the probe and the frames cost CPU: from here on the request counts
    if info is None:
        info = views.probe_upload(data)
    if info.kind == "still":
        raise StillForJob(
            "this is a still photo, not an animation or a video: send it to POST "
            f"{url_for('.convert')}, which converts it at once")
    jobs = _jobs()
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
        # before the frames are counted, so a full queue costs the client no more than
        # its request (Jobs.submit's enqueue answers the same when it fills meanwhile)
        raise Overloaded(f"the job queue is full ({waiting} jobs are waiting for a "
                         f"worker); try again in {FULL_RETRY_AFTER} s", FULL_RETRY_AFTER)
    _charge_frames(info)
    record = jobs.submit(data, info, style=style, size=size, client=client,
                         colors=options.colors)
    views.log.info("animegan.job %s", json.dumps(
        {"event": "queued", "kind": info.kind, "format": info.format, "frames": info.frames,
         "style": style, "size": size}, sort_keys=True))
    return record


@blueprint.errorhandler(views.NeedsJob)
def _moving_upload(error: views.NeedsJob) -> BaseResponse:
    """An animation or a video sent to ``/upload`` becomes a job (303 to its page); sent
    to ``/convert``, the 415 says where to send it (``jobs_url``)."""
    if request.endpoint == "animegan.upload":
        try:
            record = start_job(error.data, error.params, error.info)
        except ConversionError as refusal:
            return views._conversion_error(refusal)
        return redirect(url_for(".job_page", job_id=record.id), code=303)
    return _pointing(views._conversion_error(error), jobs_url=url_for(".create_job"))


@blueprint.errorhandler(StillForJob)
def _still_for_job(error: StillForJob) -> Response:
    return _pointing(views._conversion_error(error), convert_url=url_for(".convert"))


def _pointing(response: Response, **urls: str) -> Response:
    """A JSON refusal with the URL to send the file to instead (animegan.js follows it)."""
    if response.is_json:
        payload = response.get_json()
        payload.update(urls)
        response.set_data(json.dumps(payload))
    return response


# -- the API ---------------------------------------------------------------------------
def describe(record: JobRecord) -> dict[str, Any]:
    """What ``GET /jobs/<id>`` answers for ``record``."""
    finished = record.state == JobState.DONE
    return {
        "id": record.id,
        "state": record.state.value,
        "kind": record.kind,
        "format": record.format,
        "style": record.style,
        "frames_done": record.frames_done,
        "frames_total": record.frames_total,
        "frames_reused": record.frames_reused,
        "progress": round(record.progress, 4),
        "eta_s": (None if record.finished or record.eta_s is None
                  else round(record.eta_s, 1)),
        "error": record.error,
        # the worker's last report (Unix time): a running job's heartbeat
        "updated_at": record.updated_at,
        "url": url_for(".job", job_id=record.id),
        "page_url": url_for(".job_page", job_id=record.id),
        "result_url": url_for(".job_result", job_id=record.id) if finished else None,
        "download_url": (url_for(".job_result", job_id=record.id, download=1)
                         if finished else None),
        "preview_url": url_for(".job_preview", job_id=record.id) if finished else None,
        "result_mimetype": record.result_mimetype if finished else None,
    }


def _jobs() -> Jobs:
    jobs = get_service().jobs
    if jobs is None:
        abort(404, "jobs are off in this app")
    return jobs


def _record(job_id: str) -> JobRecord:
    """The job's record, a stalled run settled first; 404 for no such job."""
    record = _jobs().get(job_id)
    if record is None:
        abort(404, _NOT_FOUND)
    return record


def _json(payload: dict[str, Any], status: int = 200) -> Response:
    response = make_response(jsonify(payload), status)
    response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.post("/jobs")
def create_job() -> Response:
    data, params = views._read_upload()
    record = start_job(data, params)
    response = _json(describe(record), 202)
    response.headers["Location"] = url_for(".job", job_id=record.id)
    return response


@blueprint.get("/jobs/<job_id>")
def job(job_id: str) -> Response:
    return _json(describe(_record(job_id)))


@blueprint.delete("/jobs/<job_id>")
def cancel_job(job_id: str) -> Response:
    """Cancel a queued job at once, a running one between two frames (202: it stops
    soon); a finished one is left as it is (409)."""
    record = _record(job_id)
    if record.state == JobState.CANCELLED:
        return _json(describe(record))
    if record.finished:
        raise JobNotReady(f"the job has already ended ({record.state.value}); there is "
                          "nothing to cancel")
    _jobs().cancel(job_id)
    record = _record(job_id)
    return _json(describe(record), 200 if record.state == JobState.CANCELLED else 202)


def _finished(job_id: str) -> JobRecord:
    """The record of a job that is done; JobNotReady (409) for one that is not."""
    record = _record(job_id)
    if record.state != JobState.DONE:
        why = f" ({record.error})" if record.error else ""
        then = "" if record.finished else "; poll its URL until it is done"
        raise JobNotReady(f"the job has no result: it is {record.state.value}{why}{then}")
    return record


def _download_name(record: JobRecord) -> str:
    ext = _EXTENSIONS.get(record.result_mimetype or "", "bin")
    return f"anime-{record.style}.{ext}"


@blueprint.get("/jobs/<job_id>/result")
def job_result(job_id: str) -> Response:
    download = views._download_wanted(request.args.get("download", ""))
    record = _finished(job_id)
    data = _jobs().store.get_result(job_id)
    if data is None:
        abort(404, "this job's result has expired; send the file again")
    response = Response(data, mimetype=record.result_mimetype)
    if download:
        response.headers["Content-Disposition"] = (
            f'attachment; filename="{_download_name(record)}"')
    response.headers["Cache-Control"] = "private, max-age=300"
    return response


@blueprint.get("/jobs/<job_id>/preview")
def job_preview(job_id: str) -> Response:
    _finished(job_id)
    data = _jobs().store.get_preview(job_id)
    if data is None:
        abort(404, "this job's preview has expired; send the file again")
    response = Response(data, mimetype="image/jpeg")
    response.headers["Cache-Control"] = "private, max-age=300"
    return response


@blueprint.get("/jobs/<job_id>/page")
def job_page(job_id: str) -> Response:
    """The job's progress, refreshing itself every PAGE_REFRESH_S seconds until it ends,
    then its result and a download link."""
    record = _record(job_id)
    response = make_response(render_template("animegan/job.html", animegan=views._page(
        job=describe(record), refresh=None if record.finished else PAGE_REFRESH_S,
        download_name=_download_name(record) if record.state == JobState.DONE else None,
        error=None, job_error=views.sentence(record.error) if record.error else None)))
    response.headers["Cache-Control"] = views.RESULT_CACHE_CONTROL
    if not record.finished:
        # besides the page's meta refresh, which a site's layout might drop
        response.headers["Refresh"] = str(PAGE_REFRESH_S)
    return response
