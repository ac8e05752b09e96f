"""The job API and page: animations and videos converted in the background
(docs/http-api.md, "Jobs"). Only a job's random id finds it: nothing lists jobs."""

from __future__ import annotations

import logging
import weakref
from typing import Any

from flask import (
    Response,
    abort,
    jsonify,
    make_response,
    redirect,
    request,
    url_for,
)
from werkzeug.wrappers import Response as ResponseBase

from ..errors import ConversionError
from ..jobs.records import JobRecord, JobState
from ..jobs.work import NO_WORKER, Jobs
from ..service import get_service
from . import csrf, uploads, views
from .blueprint import blueprint

log = logging.getLogger("flask_animegan")
#: Seconds the page waits before it refreshes itself, and the script between polls.
PAGE_REFRESH_S = 2
#: What a job result is called when downloaded, by MIME type.
_EXTENSIONS = {"image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/png": "png",
               "image/apng": "png", "video/mp4": "mp4"}
_exempted: weakref.WeakSet[Any] = weakref.WeakSet()


class JobNotReady(ConversionError):
    """The job has no result (yet), or has ended and cannot be cancelled."""

    status = 409


@blueprint.url_value_preprocessor
def _exempt_api_from_host_csrf(endpoint: str | None, values: dict[str, Any] | None) -> None:
    # the job API reads no cookie (csrf.py); DELETE needs the id only its creator has
    protect = csrf.host_protect()
    if protect is not None and protect not in _exempted:
        protect.exempt(create_job)
        protect.exempt(cancel_job)
        _exempted.add(protect)


def describe(record: JobRecord) -> dict[str, Any]:
    """What ``GET /jobs/<id>`` answers for ``record``."""
    finished = record.state == JobState.DONE
    waiting = _jobs().waiting(record)
    return {
        "id": record.id,
        "state": record.state.value,
        "kind": record.kind,
        "format": record.format,
        "style": record.style,
        "frames_done": record.frames_done,
        "frames_total": record.frames_total,
        "frames_reused": record.frames_reused,
        # a photo's progress: the network runs it tile by tile
        "tiles_done": record.tiles_done,
        "tiles_total": record.tiles_total,
        "progress": round(record.progress, 4),
        "eta_s": (None if record.finished or record.eta_s is None
                  else round(record.eta_s, 1)),
        "error": record.error,
        # "no_worker": queued past the worker timeout with no live worker
        "waiting": waiting,
        "waiting_message": NO_WORKER if waiting == "no_worker" else None,
        # the worker's last report (Unix time): its heartbeat
        "updated_at": record.updated_at,
        "url": url_for(".job", job_id=record.id),
        "page_url": url_for(".job_page", job_id=record.id),
        "result_url": url_for(".job_result", job_id=record.id) if finished else None,
        "download_url": (url_for(".job_result", job_id=record.id, download=1)
                         if finished else None),
        "preview_url": url_for(".job_preview", job_id=record.id) if finished else None,
        # a video converts in segments of a few seconds, kept as they finish: the part
        # converted so far plays at partial_url while the rest converts
        "segments_done": record.segments_done,
        "segments_total": (-(-record.frames_total // record.segment_frames)
                           if record.segment_frames else None),
        "partial_url": (url_for(".job_partial", job_id=record.id,
                                segments=record.segments_done)
                        if _watchable(record) else None),
        "result_mimetype": record.result_mimetype if finished else None,
    }


def _watchable(record: JobRecord) -> bool:
    """Whether a running job has a part to watch: a video with a segment finished."""
    return record.kind == "video" and not record.finished and record.segments_done > 0


def _jobs() -> Jobs:
    jobs = get_service().jobs
    if jobs is None:
        abort(404, "jobs are off in this app")
    return jobs


def _record(job_id: str) -> JobRecord:
    """The job's record, a stalled run settled first; 404 for no such job."""
    record = _jobs().get(job_id)
    if record is None:
        abort(404, "no such job: it has expired or never existed; send the file again")
    return record


def _json(payload: dict[str, Any], status: int = 200) -> Response:
    response = make_response(jsonify(payload), status)
    response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.post("/jobs")
def create_job() -> Response:
    data, params = uploads.read_upload()
    return accepted(uploads.start_job(data, params))


def accepted(record: JobRecord) -> Response:
    """``202 Accepted``, the job, and its URL in ``Location``: a job just queued."""
    response = _json(describe(record), 202)
    response.headers["Location"] = url_for(".job", job_id=record.id)
    return response


@blueprint.errorhandler(uploads.Queued)
def _queued(queued: uploads.Queued) -> Response:
    # POST /convert with a photo that runs in tiles: answered as POST /jobs answers
    return accepted(queued.record)


@blueprint.get("/jobs/<job_id>")
def job(job_id: str) -> Response:
    return _json(describe(_record(job_id)))


@blueprint.delete("/jobs/<job_id>")
def cancel_job(job_id: str) -> Response:
    """Cancel a queued job at once, a running one between frames (202); a finished one: 409."""
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
    download = views.download_wanted(request.args.get("download", ""))
    record = _finished(job_id)
    data = _jobs().store.get_result(job_id)
    if data is None:
        _jobs().store.vouch_absent()
        abort(404, "this job's result has expired; send the file again")
    return views.file_response(data, record.result_mimetype or "application/octet-stream",
                               _download_name(record) if download else None)


@blueprint.get("/jobs/<job_id>/preview")
def job_preview(job_id: str) -> Response:
    _finished(job_id)
    data = _jobs().store.get_preview(job_id)
    if data is None:
        _jobs().store.vouch_absent()
        abort(404, "this job's preview has expired; send the file again")
    return views.file_response(data, "image/jpeg")


@blueprint.get("/jobs/<job_id>/partial")
def job_partial(job_id: str) -> ResponseBase:
    """The part of a running video converted so far: its first ``segments`` segments (all
    finished ones if not given) joined, with their audio; 303 to the result once done."""
    asked = request.args.getlist("segments")
    if asked and (len(asked) > 1 or not asked[0].isdigit() or int(asked[0]) < 1):
        abort(400, "segments must be one whole number from 1: how many of the finished "
                   "segments to play, as partial_url gives it")
    record = _record(job_id)
    if record.state == JobState.DONE:
        return redirect(url_for(".job_result", job_id=job_id), 303)
    wanted = int(asked[0]) if asked else record.segments_done
    found = _jobs().partial(record, wanted) if wanted > 0 else None
    if found is None:
        raise JobNotReady("no part of this job is converted yet: poll its URL until it has "
                          "a partial_url" if not record.finished
                          else f"the job has ended ({record.state.value}); nothing plays")
    data, mimetype = found
    response = views.file_response(data, mimetype)
    # what ?segments=N holds never changes: seekable, and kept by the browser
    return response.make_conditional(request, accept_ranges=True, complete_length=len(data))


@blueprint.get("/jobs/<job_id>/page")
def job_page(job_id: str) -> Response:
    """The job's progress, refreshing itself until it ends, then its result."""
    record = _record(job_id)
    watching = _watchable(record)
    response = make_response(views.render_page("animegan/job.html", views.page_context(
        job=describe(record), refresh=None if record.finished else PAGE_REFRESH_S,
        watching=watching,
        download_name=_download_name(record) if record.state == JobState.DONE else None,
        error=None, job_error=views.sentence(record.error) if record.error else None)))
    response.headers["Cache-Control"] = views.RESULT_CACHE_CONTROL
    if not record.finished and not watching:
        # besides the meta refresh, which a site's layout might drop; not while a part
        # plays: the page's script polls then, and a refresh would restart the video
        response.headers["Refresh"] = str(PAGE_REFRESH_S)
    return response
