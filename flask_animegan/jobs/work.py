"""The app's side of jobs (:class:`Jobs`): queue one, read it back, cancel it, run it.

A job is never left "running": a run whose heartbeat is older than
JOB_STALL_SECONDS (config) is queued again once, else failed, by a reader or the sweep;
so is a run whose RQ worker stopped beating, running or not yet; each step is claimed in
the store, so it happens once. A job that waits with no live worker says so."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from flask import current_app
from PIL import Image

from ..config import JOB_SECONDS_PER_FRAME, JOB_STALL_SECONDS, Settings
from ..convert.converter import Converter, StopFrames
from ..convert.costs import frames_cost
from ..convert.request import ConvertRequest, Options
from ..errors import ConversionError, Overloaded
from ..inputs.decoding import to_rgb
from ..inputs.media import AudioTrack, MediaInfo
from ..outputs.segments import segment_frames
from ..outputs.stills import encode
from .queues import JobQueue
from .records import JobRecord, JobState, JobStore

log = logging.getLogger("flask_animegan")

#: Most seconds between two progress reports of a running job (also its heartbeat).
REPORT_EVERY = 0.5
#: Runs of a job lost before they finished a segment (or a photo) after which it is run
#: again: one, so a file that kills its worker costs two runs, not a loop.
MAX_LOST_RUNS = 1
#: Long side of a photo job's preview.
PREVIEW_SIDE = 512
#: Most seconds between two sweeps of a worker.
SWEEP_EVERY = 5.0
STALLED = "the worker converting it stopped; send the file again"
NO_WORKER = "no worker is running: the site's administrator has been told"
INTERNAL = "the conversion failed on the server; try again, or send another file"


class Allowance(Protocol):
    """The client's allowance in the rate limit's storage, as a worker reaches it."""

    @property
    def cap(self) -> int: ...

    def take(self, key: list[str], amount: int, *, room: bool = True) -> bool: ...

    def refund(self, key: list[str], amount: int) -> None: ...


class JobCancelled(Exception):
    """The job's cancel flag was found set between two frames."""


class JobTaken(Exception):
    """Another run owns the job now (this one was declared stalled)."""


class WorkerStopping(Exception):
    """This process is exiting: the run stops between frames."""


def preview(still: bytes, quality: int) -> bytes:
    """A JPEG of a photo job's result at the preview's size, as an animation's preview."""
    with Image.open(io.BytesIO(still)) as image:
        image.draft("RGB", (PREVIEW_SIDE, PREVIEW_SIDE))  # a JPEG decodes reduced
        image.load()
        small = to_rgb(image)
    small.thumbnail((PREVIEW_SIDE, PREVIEW_SIDE), Image.Resampling.LANCZOS)
    return encode(small, "jpeg", quality)


def run_job(job_id: str) -> None:
    """Run the job ``job_id`` with the current app's :class:`Jobs` (RQ's entry point)."""
    jobs: Jobs = current_app.extensions["animegan"].jobs
    jobs.run(job_id)


class Jobs:
    """One app's jobs: made, read back (stalls settled), cancelled, and run in a worker."""

    def __init__(self, settings: Settings, store: JobStore, queue: JobQueue,
                 converter: Converter, convert_url: str) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue
        self.converter = converter
        #: where a still photo is sent instead
        self.convert_url = convert_url
        self._warned_at: float | None = None  # the last warning that no worker runs
        #: where a job's frames are charged as they are decoded (None: no rate limit)
        self.allowance: Allowance | None = None
        queue.sweep_with(self.sweep, self.sweep_every)
        queue.when_abandoned(self.abandoned)

    @property
    def sweep_every(self) -> float:
        """Seconds between sweeps (and a worker's beats): SWEEP_EVERY, or a quarter of the
        stall time or the worker's beat interval if shorter."""
        return min(SWEEP_EVERY, JOB_STALL_SECONDS / 4, self.settings.job_worker_beat)

    def probe(self, data: bytes) -> MediaInfo:
        """What the upload is, checked against the media limits (else ConversionError)."""
        return self.converter.decoder.probe(data)

    def submit(self, data: bytes, info: MediaInfo, *, style: str, size: int,
               client: str, colors: str = "off", output_format: str | None = None,
               portrait: str = "off", tiles: int = 0, strength: int = 100,
               charge_key: list[str] | None = None, charged: int = 0) -> JobRecord:
        """Make a job of a probed upload (a still: a photo of ``tiles`` tiles, written in
        ``output_format``) and queue it; Overloaded if the queue or store refuse.
        ``charged``: conversions taken at the door from the allowance keyed ``charge_key``."""
        photo = info.kind == "still"
        record = self.store.create(
            data, client=client, style=style, size=size,
            kind="photo" if photo else info.kind, format=info.format,
            frames_total=info.frames, colors=colors, strength=strength,
            charge_key=charge_key or [], charged=charged,
            **({"output_format": output_format or "jpeg", "portrait": portrait,
                "tiles_total": tiles} if photo else {}))
        if record is None:
            raise Overloaded("the job store is unavailable or full; try again in 30 s", 30)
        try:
            self.queue.enqueue(record.id)
        except Overloaded:
            self._finish(record, JobState.FAILED, "the job queue was full")
            raise
        return record

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record, a stalled run settled first (None: no such job);
        StorageUnavailable (503) while the storage cannot say."""
        record = self.store.get(job_id)
        if record is None:
            self.store.vouch_absent()
            return None
        return self.settle(record)

    def unfinished(self, client: str) -> int:
        """How many of the client's newest jobs are queued or running, stalls settled first."""
        return sum(1 for record in self.store.client_jobs(client)
                   if not self.settle(record).finished)

    def sweep(self) -> int:
        """Settle the stalled runs among the newest started, read or not; how many."""
        stalled = [record for record in self.store.started() if self._stalled(record)]
        for record in stalled:
            self.settle(record)
        return len(stalled)

    def _stalled(self, record: JobRecord) -> bool:
        return (record.state == JobState.RUNNING
                and time.time() - record.updated_at > JOB_STALL_SECONDS)

    def settle(self, record: JobRecord) -> JobRecord:
        """Queue again (once) or fail a run whose worker stopped reporting, once among readers;
        so too a queued run the queue lost (failed by a cleaner that was not ours)."""
        if (record.state == JobState.QUEUED
                and time.time() - record.updated_at > self.settings.job_worker_timeout
                and not self.queue.run_pending(record.id, record.attempts)):
            self.abandoned(record.id, record.attempts)
            return self.store.get(record.id) or record
        if not self._stalled(record):
            return record
        if not self.store.claim(record.id, f"settle-{record.attempts}", JOB_STALL_SECONDS):
            return self.store.get(record.id) or record
        current = self.store.get(record.id)  # it may have reported since it was read
        if current is None or current.attempts != record.attempts or not self._stalled(current):
            return current or record
        record = current
        if self._run_again(record, f"stalled (no report for "
                                   f"{time.time() - record.updated_at:.0f} s)"):
            return record
        log.warning("flask_animegan: job %s stalled; marked failed", record.id)
        return self._finish(record, JobState.FAILED, STALLED)

    def abandoned(self, job_id: str, attempt: int) -> None:
        """Queue again (once) or fail the job whose run ``attempt`` lost its worker (RQ's
        registry expired it): taken and not started yet, or running; once among sweepers."""
        record = self.store.get(job_id)
        if record is None or not self._owned_by(record, attempt):
            return  # ended, or another run has it now
        if not self.store.claim(job_id, f"settle-{attempt + 1}", JOB_STALL_SECONDS):
            return
        current = self.store.get(job_id)
        if current is None or not self._owned_by(current, attempt):
            return
        current.attempts = attempt + 1  # the lost run counts, so its successor's id is new
        if not self._run_again(current, f"lost its worker (no heartbeat for "
                                        f"{self.settings.job_worker_timeout} s)"):
            log.warning("flask_animegan: job %s lost its worker; marked failed", job_id)
            self._finish(current, JobState.FAILED, STALLED)

    @staticmethod
    def _owned_by(record: JobRecord, attempt: int) -> bool:
        """Whether run ``attempt`` (0 first) owns the record: queued for it, or running it."""
        return ((record.state == JobState.QUEUED and record.attempts == attempt)
                or (record.state == JobState.RUNNING and record.attempts == attempt + 1))

    def waiting(self, record: JobRecord) -> str | None:
        """``"no_worker"`` for a job queued longer than the worker timeout while no worker
        beats (warned in the log once per timeout), else None."""
        timeout = self.settings.job_worker_timeout
        if record.state != JobState.QUEUED or time.time() - record.updated_at <= timeout:
            return None
        try:
            if self.queue.live_workers():
                return None
        except Exception:  # noqa: BLE001 - an unreachable queue is /healthz's to report
            return None
        self._warn_no_worker(time.time() - record.updated_at)
        return "no_worker"

    def _warn_no_worker(self, waited: float) -> None:
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < self.settings.job_worker_timeout:
            return
        self._warned_at = now
        log.warning("flask_animegan: a job has waited %.0f s and no job worker sent a "
                    "heartbeat in %d s (ANIMEGAN_JOB_WORKER_TIMEOUT): start `flask animegan "
                    "worker` on the jobs' Redis", waited, self.settings.job_worker_timeout)

    def _run_again(self, record: JobRecord, why: str, *, lost: bool = True) -> bool:
        """Queue the job's next run, from its first segment not finished; False if it was
        cancelled, is refused, or had a ``lost`` run (one that finished no segment) before."""
        lost = lost and record.segments_done <= record.run_from
        if (lost and record.lost_runs >= MAX_LOST_RUNS) or record.cancel_requested:
            return False
        record.lost_runs += lost
        log.warning("flask_animegan: job %s %s; queued again%s", record.id, why,
                    f" from segment {record.segments_done + 1}" if record.segments_done else "")
        record.state = JobState.QUEUED
        record.frames_done = record.segments_done * record.segment_frames
        record.frames_reused = record.segments_reused
        record.tiles_done = 0
        record.eta_s, record.updated_at = None, time.time()
        self.store.update(record)
        try:
            self.queue.enqueue(record.id, record.attempts)
        except Overloaded:
            return False
        return True

    def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel a job: a queued one ends now, a running one at its next frame."""
        record = self.get(job_id)
        if record is None or record.finished:
            return record
        self.store.request_cancel(job_id)
        record.cancel_requested = True
        running = record.state == JobState.RUNNING  # its run counted in attempts already
        self.queue.cancel(job_id, record.attempts - 1 if running else record.attempts)
        if record.state == JobState.QUEUED:
            return self._finish(record, JobState.CANCELLED, None)
        return record

    def status(self) -> dict[str, Any]:
        """The queue for /healthz; ``no_worker``: a job waited longer than the worker
        timeout and no worker beat within it (warned in the log once per timeout)."""
        status = self.queue.status()
        oldest: float | None = status.get("oldest_queued_s")
        status["worker_timeout_s"] = self.settings.job_worker_timeout
        status["no_worker"] = bool(status["ok"] and status["workers"] == 0
                                   and oldest is not None
                                   and oldest > self.settings.job_worker_timeout)
        if status["no_worker"] and oldest is not None:
            self._warn_no_worker(oldest)
        return status

    def run(self, job_id: str) -> None:
        """Convert the job in a worker, store its result and preview, finish its record."""
        record = self.store.get(job_id)
        if record is None or record.state != JobState.QUEUED:
            return  # cancelled, expired, or taken by another worker already
        if record.cancel_requested:
            self._finish(record, JobState.CANCELLED, None)
            return
        data = self.store.get_input(job_id)
        if data is None:
            self._finish(record, JobState.FAILED, "the upload expired before a worker "
                                                  "took the job; send it again")
            return
        if not self.store.claim(job_id, f"run-{record.attempts + 1}", JOB_STALL_SECONDS):
            return  # a second entry of this run in the queue: another worker has it
        record.state, record.attempts = JobState.RUNNING, record.attempts + 1
        record.started_at = record.updated_at = time.time()
        self.store.start(record)
        try:
            self._convert(record, data)
        except JobTaken:
            log.info("flask_animegan: job %s was taken over; this run stops", job_id)
        except WorkerStopping:
            # a deploy, not the job's fault: its finished segments are kept, and the rest
            # goes to the next worker now, not after the stall time
            if not (self.queue.shared and self._run_again(
                    record, f"was handed back at frame {record.frames_done} by a worker "
                            "that is stopping", lost=False)):
                log.warning("flask_animegan: job %s stopped at frame %d because this process "
                            "is exiting; the stall rule settles it", job_id, record.frames_done)
        except JobCancelled:
            self._finish(record, JobState.CANCELLED, None)
        except Overloaded as exc:
            # a decode helper starved of CPU: the machine's fault, not the file's
            if not self._run_again(record, f"was starved of CPU ({exc})"):
                self._finish(record, JobState.FAILED, str(exc))
        except ConversionError as exc:
            self._finish(record, JobState.FAILED, str(exc))
        except Exception:
            log.exception("flask_animegan: job %s failed", job_id)
            self._finish(record, JobState.FAILED, INTERNAL)

    def _convert(self, record: JobRecord, data: bytes) -> None:
        if record.kind == "photo":
            self._convert_photo(record, data)
            return
        started = time.monotonic()
        deadline = started + self.settings.job_timeout
        request = self._media_request(record)
        info = self.probe(data)
        if info.kind == "still":
            raise ConversionError("this is a still photo, not an animation or a video: "
                                  f"send it to POST {self.convert_url}")
        record.frames_total = info.frames
        record.segment_frames = segment_frames(info)
        record.run_from = record.segments_done  # where this run resumes
        first = record.segments_done * record.segment_frames
        record.frames_done, record.frames_reused = first, record.segments_reused
        audio = self._audio(record, data, info)
        self._report(record, None)  # the frame count and a heartbeat before the first frame
        last_report, counted = started, first

        def progress(done: int, reused: int) -> None:
            nonlocal last_report, counted
            record.frames_done, record.frames_reused = done, record.segments_reused + reused
            self._charge_frames(record)
            if self.queue.stopping:
                raise WorkerStopping
            if time.monotonic() > deadline:
                raise ConversionError(
                    f"the job took longer than {self.settings.job_timeout} s "
                    f"({JOB_SECONDS_PER_FRAME} s a frame of ANIMEGAN_MAX_FRAMES); send a "
                    "shorter or smaller file")
            if time.monotonic() - last_report >= REPORT_EVERY:
                self.queue.frames_converted(done - counted)  # for the scale metrics
                counted = done
                self._report(record, started, first)
                last_report = time.monotonic()

        if record.stopped is None:  # else a run before stored the last segment there is
            for segment in self.converter.segments(
                    data, info, request, start=record.segments_done, progress=progress,
                    on_busy=self._waiting(record),
                    timeout_total=float(self.settings.job_timeout)):
                self._check_owner(record)
                if not (self.store.put_segment(record.id, segment)
                        and (not segment.preview
                             or self.store.put_preview(record.id, segment.preview))):
                    raise ConversionError("the result could not be stored (the job store is "
                                          "full or unavailable); try again later")
                record.segments_done, record.stopped = segment.index + 1, segment.stopped
                record.segments_reused += segment.reused
                record.frames_done = segment.start + segment.frames
                self._report(record, started, first)  # kept: a later run starts after it
        self.queue.frames_converted(record.frames_done - counted)
        segments = self.store.get_segments(record.id, record.segments_done)
        if not segments:
            raise ConversionError("the converted part of this job has expired or the file "
                                  "holds no frame to convert; send it again")
        track, error = audio
        result = self.converter.join(data, info, request, segments, track, audio_error=error)
        self._check_owner(record)
        if not self.store.put_result(record.id, result):
            raise ConversionError("the result could not be stored (the job store is full "
                                  "or unavailable); try again later")
        record.result_mimetype = self.converter.media_type(info)
        record.frames_total = record.frames_done
        self._finish(record, JobState.DONE, record.stopped)

    def _audio(self, record: JobRecord, data: bytes,
               info: MediaInfo) -> tuple[AudioTrack | None, str | None]:
        """The video's audio as the job's first run read it (kept with the job), so that a
        resumed job writes the same; read and kept now on the first run."""
        if info.kind != "video":
            return None, None
        kept = self.store.get_audio(record.id)
        if kept is not None:
            return kept
        track, error = self.converter.audio(data, info)
        if not self.store.put_audio(record.id, track, error):
            raise ConversionError("the job's audio could not be stored (the job store is "
                                  "full or unavailable); try again later")
        return track, error

    def partial(self, record: JobRecord, segments: int) -> tuple[bytes, str] | None:
        """The first ``segments`` finished segments of a running video joined, with their
        audio up to their last frame and their label (unsigned: a preview, not the result),
        and its MIME type; None if there are none or they have expired."""
        count = min(segments, record.segments_done)
        if record.kind != "video" or record.finished or count < 1:
            return None
        parts = self.store.get_segments(record.id, count)
        audio = self.store.get_audio(record.id)
        if not parts:
            return None
        info = MediaInfo(record.kind, record.format, 0, 0, record.frames_total, 0.0, None,
                         False, None)
        track, error = audio if audio is not None else (None, None)
        data = self.converter.join(b"", info, self._media_request(record), parts, track,
                                   audio_error=error, partial=True)
        return data, self.converter.media_type(info)

    def _media_request(self, record: JobRecord) -> ConvertRequest:
        """What an animation's or a video's frames are converted with (its output keeps
        the upload's kind, so the format is only the request's placeholder)."""
        return ConvertRequest(self.converter.engine.style(record.style), record.size, "jpeg",
                              Options(colors=record.colors, portrait="off",
                                      strength=record.strength))

    def _waiting(self, record: JobRecord) -> Callable[[], None]:
        """What a job does while web conversions keep the gate (local queue): stop if the
        worker is stopping, else report that it lives and wait its turn."""
        def busy() -> None:
            if self.queue.stopping:
                raise WorkerStopping
            self._report(record, None)
        return busy

    def _convert_photo(self, record: JobRecord, data: bytes) -> None:
        """A photo in tiles: the Converter's photo path, reporting tile by tile."""
        deadline = time.monotonic() + self.settings.job_timeout
        request = ConvertRequest(self.converter.engine.style(record.style), record.size,
                                 record.output_format or "jpeg",
                                 Options(colors=record.colors, portrait=record.portrait,
                                         strength=record.strength))
        record.tiles_done = record.tiles_total = 0  # 0 in all: the photo is being read
        self._report(record, None)
        first_tile: float | None = None
        last_report = time.monotonic()

        def progress(done: int, total: int) -> None:
            nonlocal first_tile, last_report
            now = time.monotonic()
            if done == 0:  # read: the statistics pass and the tiles from here
                first_tile = now
            record.tiles_done, record.tiles_total = done, total
            if self.queue.stopping:
                raise WorkerStopping
            if now > deadline:
                raise ConversionError(f"the photo took longer than "
                                      f"{self.settings.job_timeout} s; send a smaller size")
            if done == 0 or done == total or now - last_report >= REPORT_EVERY:
                if done and first_tile is not None:
                    per_tile = (now - first_tile) / done
                    record.eta_s = round(per_tile * (total - done), 1)
                self._report(record, None)
                last_report = time.monotonic()

        scope = record.client if self.settings.cache_scope == "client" else None
        conversion = self.converter.photo(data, request, scope, progress=progress,
                                          on_busy=self._waiting(record))
        self._check_owner(record)
        self._charge_faces(record, conversion.faces or 0)
        small = preview(conversion.data, self.converter.quality)
        if not self.store.put_result(record.id, conversion.data, small):
            raise ConversionError("the result could not be stored (the job store is full "
                                  "or unavailable); try again later")
        record.result_mimetype = conversion.mimetype
        record.frames_done = 1
        record.tiles_done = record.tiles_total
        self._finish(record, JobState.DONE, None)

    def _charge_frames(self, record: JobRecord) -> None:
        """Take from the client's allowance as the frames decoded pass what was charged;
        StopFrames (the result ends there) when it has no room left."""
        if self.allowance is None or not record.charge_key:
            return
        needed = frames_cost(record.frames_done)
        if needed <= record.charged:
            return
        if not self.allowance.take(record.charge_key, needed - record.charged):
            raise StopFrames(
                f"the rate limit ran out after {record.frames_done - 1} frames: this file "
                "has more frames than its header says, and they count as conversions; the "
                "result ends there. Send a shorter clip, or try again when your limit has room")
        record.charged = needed
        self._report(record, None)  # stored at once, so that a refund counts it

    def _charge_faces(self, record: JobRecord, faces: int) -> None:
        """Portrait mode's faces, an inference each, on top of the pixels the door charged
        (at most the whole limit, as every photo); taken even when the limit has no room."""
        if self.allowance is None or not record.charge_key or not faces:
            return
        total = min(self.allowance.cap, record.charged + faces)
        if total > record.charged:
            self.allowance.take(record.charge_key, total - record.charged, room=False)
            record.charged = total

    def _refund(self, record: JobRecord) -> None:
        """Give back what the door took beyond the frames decoded (a header without a
        count was charged the most the limits allow)."""
        if self.allowance is None or not record.charge_key or record.kind == "photo":
            return
        unused = record.charged - max(1, frames_cost(record.frames_done))
        if unused > 0:
            self.allowance.refund(record.charge_key, unused)
            record.charged -= unused

    def _report(self, record: JobRecord, started: float | None, first: int = 0) -> None:
        """Progress and heartbeat; stops the run when cancelled or taken over. The ETA:
        this run's time a frame since ``started`` at frame ``first``."""
        self._check_owner(record)
        if started is not None and record.frames_done > first:
            per_frame = (time.monotonic() - started) / (record.frames_done - first)
            record.eta_s = round(per_frame * max(record.frames_total - record.frames_done, 0), 1)
        record.updated_at = time.time()
        self.store.update(record)

    def _check_owner(self, record: JobRecord) -> None:
        stored = self.store.get(record.id)
        if stored is None or stored.state != JobState.RUNNING or stored.attempts != record.attempts:
            raise JobTaken
        if stored.cancel_requested:
            raise JobCancelled

    def _finish(self, record: JobRecord, state: JobState, error: str | None) -> JobRecord:
        record.state, record.error = state, error
        record.finished_at = record.updated_at = time.time()
        record.eta_s = 0.0 if state == JobState.DONE else None
        self._refund(record)
        record.charge_key = []  # the client's key in clear: kept only while the job runs
        self.store.update(record)
        self.store.drop_input(record.id)
        if record.kind != "photo":
            self.store.drop_parts(record.id, record.segments_done)
        return record
