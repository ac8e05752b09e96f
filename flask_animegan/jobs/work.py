"""Running a job: decode each frame, convert it (once for a run of frames that repeat it,
by jobs/repeats.py's rule), write the output, report progress; and the app's side of
jobs, :class:`Jobs`.

:func:`run_job` is the one entry point: RQ imports it by name in ``flask animegan worker``
processes, the local queue's thread calls it. Both run it in the app's context and reach
:class:`Jobs` through ``current_app.extensions["animegan"].jobs`` (the jobs room never
imports the service, which imports it).

A job is never left at "running": a worker reports (the record's ``updated_at``) at least
every :data:`REPORT_EVERY` seconds while it converts, and a running record whose report is
older than ANIMEGAN_JOB_STALL_SECONDS (its worker was killed, its machine lost) is queued
again, once, or else marked failed (:meth:`Jobs.settle`). Whoever reads the job settles it
(:meth:`Jobs.get`, the client's count), and so does the sweep (:meth:`Jobs.sweep`) that
every ``flask animegan worker`` and the local queue's thread run every
:meth:`Jobs.sweep_every` seconds over the newest runs started: a stalled job is settled
within ANIMEGAN_JOB_STALL_SECONDS + sweep_every + REPORT_EVERY of its worker's death, read
or not. Each step is claimed (:meth:`JobStore.claim`), so several readers, sweepers and
workers on one Redis settle a run once and start a run once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from flask import current_app
from PIL import Image

from ..config import Settings
from ..errors import ConversionError, Overloaded
from ..inputs.colors import keep_colors
from ..inputs.isolation import Decoder
from ..inputs.media import Frame, MediaInfo
from ..runtime.engine import InferenceEngine
from . import repeats
from .queues import JobQueue
from .records import JobRecord, JobState, JobStore

log = logging.getLogger("flask_animegan")

#: Most seconds between two progress reports of a running job (also its heartbeat).
REPORT_EVERY = 0.5
#: Runs of one job at most: the first and one after a stalled worker.
MAX_ATTEMPTS = 2
#: Most seconds between two sweeps of a worker (a quarter of the stall time when shorter).
SWEEP_EVERY = 5.0
STALLED = "the worker converting it stopped; send the file again"
INTERNAL = "the conversion failed on the server; try again, or send another file"


class JobCancelled(Exception):
    """The job's cancel flag was found set between two frames."""


class JobTaken(Exception):
    """The record says another run owns the job now (this one was declared stalled)."""


class WorkerStopping(Exception):
    """This process is exiting (:attr:`JobQueue.stopping`): the run stops between frames."""


def _encoders() -> Any:
    """jobs/encoders.py, imported on first use: it needs PyAV (the `jobs` extra), which an
    app that converts only photos need not install."""
    try:
        from . import encoders
    except ImportError as exc:
        raise ConversionError("animations and videos need PyAV on this server: pip install "
                              "'flask-animegan[jobs]'") from exc
    return encoders


def run_job(job_id: str) -> None:
    """Run the job ``job_id`` with the current app's :class:`Jobs` (RQ's entry point)."""
    jobs: Jobs = current_app.extensions["animegan"].jobs
    jobs.run(job_id)


class Jobs:
    """One app's jobs: checking an upload, making a job, reading it back (settling stalls),
    cancelling, and running one (:meth:`run`, in a worker)."""

    def __init__(self, settings: Settings, store: JobStore, queue: JobQueue,
                 engine: InferenceEngine, decoder: Decoder) -> None:
        self.settings = settings
        self.store = store
        self.queue = queue
        self.engine = engine
        self.decoder = decoder
        #: Reuse the last converted frame's result for a frame that repeats it (the rule of
        #: jobs/repeats.py); bench/jobs.py turns it off to measure the saving.
        self.reuse_repeats = True
        self.limits = decoder.media
        queue.sweep_with(self.sweep, self.sweep_every)

    @property
    def sweep_every(self) -> float:
        """Seconds between two sweeps of a worker: SWEEP_EVERY, or a quarter of
        ANIMEGAN_JOB_STALL_SECONDS when that is shorter."""
        return min(SWEEP_EVERY, self.settings.job_stall_seconds / 4)

    # -- at the door (the web process) -------------------------------------------------
    def probe(self, data: bytes) -> MediaInfo:
        """What the upload is, from its headers, checked against the limits (in the decode
        helper process unless ANIMEGAN_DECODE_ISOLATION=thread); raises ConversionError."""
        return self.decoder.probe(data)

    def submit(self, data: bytes, info: MediaInfo, *, style: str, size: int,
               client: str, colors: str = "off") -> JobRecord:
        """Make a job of a probed upload and queue it. Raises Overloaded (503) when the
        queue is full or the storage refuses the job; the views check the client's limits
        (:meth:`unfinished`, the rate limit) before."""
        record = self.store.create(data, client=client, style=style, size=size,
                                   kind=info.kind, format=info.format,
                                   frames_total=info.frames, colors=colors)
        if record is None:
            raise Overloaded("the job store is unavailable or full; try again in 30 s", 30)
        try:
            self.queue.enqueue(record.id)
        except Overloaded:
            self._finish(record, JobState.FAILED, "the job queue was full")
            raise
        return record

    def get(self, job_id: str) -> JobRecord | None:
        """The job's record, a stalled run settled first (None: no such job)."""
        record = self.store.get(job_id)
        return self.settle(record) if record is not None else None

    def unfinished(self, client: str) -> int:
        """How many of the client's newest jobs are queued or running, stalled runs
        settled first (a job whose worker died is no longer counted once it failed)."""
        return sum(1 for record in self.store.client_jobs(client)
                   if not self.settle(record).finished)

    def sweep(self) -> int:
        """Settle the stalled runs among the newest started (JobStore.started), read by
        a client or not; how many stalled runs it found."""
        stalled = [record for record in self.store.started() if self._stalled(record)]
        for record in stalled:
            self.settle(record)
        return len(stalled)

    def _stalled(self, record: JobRecord) -> bool:
        return (record.state == JobState.RUNNING
                and time.time() - record.updated_at > self.settings.job_stall_seconds)

    def settle(self, record: JobRecord) -> JobRecord:
        """A running job whose worker stopped reporting is queued again (once) or failed:
        the one rule of the readers and the sweep. Of several settling one run at once,
        the one that claims it does; the others get the record as stored."""
        if not self._stalled(record):
            return record
        stall = self.settings.job_stall_seconds
        if not self.store.claim(record.id, f"settle-{record.attempts}", stall):
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

    def _run_again(self, record: JobRecord, why: str) -> bool:
        """Queue the job's next run if it has one left (MAX_ATTEMPTS) and was not
        cancelled; False when it has none, or the queue refused it."""
        if record.attempts >= MAX_ATTEMPTS or record.cancel_requested:
            return False
        log.warning("flask_animegan: job %s %s; queued again", record.id, why)
        record.state, record.frames_done, record.frames_reused = JobState.QUEUED, 0, 0
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
        """The queue for /healthz."""
        return self.queue.status()

    # -- in a worker -------------------------------------------------------------------
    def run(self, job_id: str) -> None:
        """Convert the job: each frame decoded in the helper, converted (or the previous
        result reused), written; the result and preview stored; the record finished."""
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
        if not self.store.claim(job_id, f"run-{record.attempts + 1}",
                                self.settings.job_stall_seconds):
            return  # a second entry of this run in the queue: another worker has it
        record.state, record.attempts = JobState.RUNNING, record.attempts + 1
        record.started_at = record.updated_at = time.time()
        self.store.start(record)
        try:
            self._convert(record, data)
        except JobTaken:
            log.info("flask_animegan: job %s was taken over; this run stops", job_id)
        except WorkerStopping:
            log.warning("flask_animegan: job %s stopped at frame %d because this process is "
                        "exiting; the stall rule settles it, as a stopped worker's job",
                        job_id, record.frames_done)
        except JobCancelled:
            self._finish(record, JobState.CANCELLED, None)
        except Overloaded as exc:
            # a decode helper that got too little CPU to finish in its time (the machine,
            # not the file): the job's next run gets a fresh helper, on any worker
            if not self._run_again(record, f"was starved of CPU ({exc})"):
                self._finish(record, JobState.FAILED, str(exc))
        except ConversionError as exc:
            self._finish(record, JobState.FAILED, str(exc))
        except Exception:
            log.exception("flask_animegan: job %s failed", job_id)
            self._finish(record, JobState.FAILED, INTERNAL)

    def _convert(self, record: JobRecord, data: bytes) -> None:
        started = time.monotonic()
        deadline = started + self.settings.job_timeout
        style = self.engine.style(record.style)
        info = self.probe(data)
        if info.kind == "still":
            raise ConversionError("this is a still photo, not an animation or a video: "
                                  "send it to POST /animegan/convert")
        record.frames_total = info.frames
        self._report(record, None)  # the frame count and a heartbeat before the first frame
        encoders = _encoders()
        writer, mimetype = encoders.writer_for(info, data, quality=self.settings.jpeg_quality,
                                               decoder=self.decoder)
        anchor: repeats.Picture | None = None  # the last frame converted
        converted: Image.Image | None = None
        first: Image.Image | None = None
        last_report = started
        frames = self._frames(data, info, record.size, style.face)
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(writer.close)  # an abandoned result: its temporary file goes
            cleanup.callback(getattr(frames, "close", lambda: None))  # the helper, killed
            for frame in frames:
                if self.queue.stopping:
                    raise WorkerStopping
                if time.monotonic() > deadline:
                    raise ConversionError(
                        f"the job took longer than {self.settings.job_timeout} s "
                        "(ANIMEGAN_JOB_TIMEOUT); send a shorter or smaller file")
                picture = repeats.Picture.of(frame.image) if self.reuse_repeats else None
                if picture is not None and converted is not None and repeats.is_repeat(
                        picture, anchor):
                    record.frames_reused += 1
                else:
                    converted, anchor = self._infer(record, frame, style.name), picture
                if first is None:
                    first = converted
                writer.add(converted, frame.duration_ms, frame.disposal, pts=frame.pts)
                record.frames_done += 1
                if time.monotonic() - last_report >= REPORT_EVERY:
                    self._report(record, started)
                    last_report = time.monotonic()
            if first is None:
                raise ConversionError("the file holds no frame to convert")
            result = writer.finish()
        self._check_owner(record)
        if not self.store.put_result(record.id, result,
                                     encoders.preview(first, self.settings.jpeg_quality)):
            raise ConversionError("the result could not be stored (the job store is full "
                                  "or unavailable); try again later")
        record.result_mimetype = mimetype
        record.frames_total = record.frames_done
        self._finish(record, JobState.DONE, None)

    def _frames(self, data: bytes, info: MediaInfo, size: int, square: bool) -> Iterator[Frame]:
        return self.decoder.frames(data, info, size=size, square=square,
                                   total_timeout=float(self.settings.job_timeout))

    def _infer(self, record: JobRecord, frame: Frame, style: str) -> Image.Image:
        """One frame through the network; waits (reporting) while the model is busy."""
        while True:
            try:
                return keep_colors(self.engine.run(frame.image, style), frame.image,
                                   record.colors)
            except Overloaded:  # web conversions fill the gate (local queue): wait our turn
                if self.queue.stopping:
                    raise WorkerStopping from None
                self._report(record, None)
                time.sleep(REPORT_EVERY)

    def _report(self, record: JobRecord, started: float | None) -> None:
        """Progress and heartbeat; stops the run when cancelled or taken over."""
        self._check_owner(record)
        if started is not None and record.frames_done:
            per_frame = (time.monotonic() - started) / record.frames_done
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
        self.store.update(record)
        self.store.drop_input(record.id)
        return record
