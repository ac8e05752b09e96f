"""Where jobs wait for a worker: RQ on Redis, or one thread in this process (its waiting
jobs are lost with it). Every worker also runs the sweep of stalled runs; an RQ worker's
sweep also sends its heartbeat and hands the runs of workers that stopped beating back."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import queue
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..config import SettingError, Settings, is_redis
from ..errors import Overloaded, StorageUnavailable
from ..process import process_alive

if TYPE_CHECKING:
    from rq import SimpleWorker

log = logging.getLogger("flask_animegan")

#: What RQ imports and calls in the worker, with the job's id.
ENTRY_POINT = "flask_animegan.jobs.work.run_job"
QUEUE_NAME = "animegan"
#: Frames converted are counted in buckets of this many seconds, kept a few minutes.
FRAME_BUCKET_S = 10
#: The window frames per second are averaged over.
FRAME_RATE_WINDOW_S = 60
#: Seconds a stopping RQ worker waits for its pubsub connection to close.
UNSUBSCRIBE_WAIT = 2.0
#: Seconds to retry after when the queue is full or Redis is unreachable.
FULL_RETRY_AFTER = 30


T = TypeVar("T")
#: What a route is told when the queue's Redis does not answer: it has lost nothing.
UNREACHABLE = ("the job queue cannot be reached just now; nothing is lost: try again in "
               f"{StorageUnavailable.RETRY_AFTER} s")


def _reaching(method: Callable[..., T]) -> Callable[..., T]:
    """An RQQueue method whose Redis errors become :class:`StorageUnavailable` (503 with
    Retry-After): the one place the job routes' queue faults are translated."""

    @functools.wraps(method)
    def call(self: RQQueue, *args: Any, **kwargs: Any) -> T:
        import redis

        try:
            return method(self, *args, **kwargs)
        except (redis.RedisError, OSError) as exc:
            log.warning("flask_animegan: the job queue's Redis is unavailable (%s)",
                        type(exc).__name__)
            raise StorageUnavailable(UNREACHABLE) from exc

    return call


def _full(waiting: int) -> Overloaded:
    return Overloaded(f"the job queue is full ({waiting} jobs are waiting for a worker); "
                      f"try again in {FULL_RETRY_AFTER} s", FULL_RETRY_AFTER)


class JobQueue(ABC):
    """Runs jobs by id, one at a time per worker."""

    kind: str = ""
    #: whether a run handed back here is taken by another worker (not lost with this process)
    shared: bool = False
    _sweep: Callable[[], object] | None = None
    _sweep_every = 5.0
    _sweeper: threading.Thread | None = None
    _abandoned: Callable[[str, int], object] | None = None

    @property
    def stopping(self) -> bool:
        """Whether this process is exiting: a job running here stops at its next frame."""
        return False

    def sweep_with(self, sweep: Callable[[], object], every: float) -> None:
        """Set what the workers run every ``every`` seconds beside their jobs."""
        self._sweep, self._sweep_every = sweep, every

    def when_abandoned(self, handler: Callable[[str, int], object]) -> None:
        """Call ``handler(job_id, attempt)`` for a run whose worker stopped beating."""
        self._abandoned = handler

    def start_sweeping(self) -> None:
        """Start the sweep's daemon thread in this process, once."""
        if self._sweep is None or self._sweeper is not None:
            return
        self._sweeper = threading.Thread(target=self._sweeping, name="animegan-sweep",
                                         daemon=True)
        self._sweeper.start()

    def _sweeping(self) -> None:
        assert self._sweep is not None
        while True:
            time.sleep(self._sweep_every)
            try:
                self._tick()
                self._sweep()
            except Exception:  # the next sweep tries again: never stop sweeping
                log.exception("flask_animegan: the sweep of stalled jobs failed")

    def _tick(self) -> None:
        """What a worker does on each sweep before settling stalled runs (RQ: beat)."""

    @abstractmethod
    def enqueue(self, job_id: str, attempt: int = 0) -> None:
        """Queue the job's ``attempt``-th run; :class:`Overloaded` when full or unreachable."""

    @abstractmethod
    def cancel(self, job_id: str, attempt: int = 0) -> None:
        """Take a waiting job out where the queue can (a running one stops on its record's flag)."""

    @abstractmethod
    def queued_count(self) -> int:
        """Jobs waiting for a worker."""

    def run_pending(self, job_id: str, attempt: int) -> bool:
        """Whether run ``attempt`` of the job still waits or runs in the queue (True when
        the queue cannot tell): a run the queue dropped or failed is lost."""
        return True

    @abstractmethod
    def live_workers(self) -> int:
        """Workers that beat within the worker timeout; raises if the queue is unreachable."""

    @abstractmethod
    def oldest_wait(self) -> float | None:
        """Seconds the oldest waiting job has waited (None: none waits)."""

    @abstractmethod
    def frames_converted(self, count: int) -> None:
        """Count ``count`` frames converted by a worker of this queue (for the metrics);
        never raises."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """The queue for /healthz and /metrics: ``kind``, ``name``, ``ok``, ``queued``,
        ``max_queue``, ``running``, ``workers`` (live ones), ``oldest_queued_s``,
        ``frames_total``, ``frames_per_second``."""


class LocalQueue(JobQueue):
    """A bounded queue and one daemon thread running ``runner(job_id)`` in the app's context."""

    kind = "local"
    #: Seconds :meth:`stop` waits at exit for the running job to reach its next frame.
    STOP_WAIT = 10.0

    def __init__(self, runner: Callable[[str], None], *, max_queue: int) -> None:
        self.max_queue = max_queue
        self._runner = runner
        self._waiting: queue.Queue[tuple[str, float]] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.running: str | None = None
        self._frames = _FrameBuckets()

    def enqueue(self, job_id: str, attempt: int = 0) -> None:
        self._start()
        try:
            self._waiting.put_nowait((job_id, time.monotonic()))
        except queue.Full:
            raise _full(self.max_queue) from None

    def cancel(self, job_id: str, attempt: int = 0) -> None:
        pass  # a cancelled job that reaches the thread is skipped by run_job

    def queued_count(self) -> int:
        return self._waiting.qsize()

    def live_workers(self) -> int:
        return 1  # the thread starts with the first job

    def oldest_wait(self) -> float | None:
        with self._waiting.mutex:
            oldest = self._waiting.queue[0][1] if self._waiting.queue else None
        return None if oldest is None else time.monotonic() - oldest

    def frames_converted(self, count: int) -> None:
        self._frames.add(count, time.time())

    def status(self) -> dict[str, Any]:
        total, per_second = self._frames.read(time.time())
        return {"kind": self.kind, "name": self.kind, "ok": True,
                "queued": self.queued_count(), "max_queue": self.max_queue,
                "running": 1 if self.running else 0, "workers": 1,
                "oldest_queued_s": _rounded(self.oldest_wait()), "frames_total": total,
                "frames_per_second": per_second}

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, wait: float = STOP_WAIT) -> None:
        """At exit, let the running job stop at its next frame (else exit aborts the process)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and self.running is not None:
            thread.join(wait)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                if self._thread is None:
                    atexit.register(self.stop)
                self._thread = threading.Thread(target=self._work, name="animegan-jobs",
                                                daemon=True)
                self._thread.start()
            self.start_sweeping()

    def _work(self) -> None:
        while not self._stop.is_set():
            job_id, _ = self._waiting.get()
            if self._stop.is_set():
                return
            self.running = job_id
            try:
                self._runner(job_id)
            except Exception:
                log.exception("flask_animegan: job %s ended with an unexpected error", job_id)
            finally:
                self.running = None
                self._waiting.task_done()


class RQQueue(JobQueue):
    """An ``rq.Queue``; each run is its own RQ job, so a requeued run never meets a dead one's."""

    kind = "rq"
    shared = True

    def __init__(self, uri: str, *, max_queue: int, job_timeout: int, ttl: int,
                 worker_timeout: int = 60, beat: int = 10, name: str = QUEUE_NAME) -> None:
        from rq import Queue

        from ..storage import redis as redis_storage

        self.uri = uri
        self.name = name
        self.max_queue = max_queue
        self.job_timeout = job_timeout
        self.ttl = ttl
        self.worker_timeout, self.beat = worker_timeout, beat
        self._worker: SimpleWorker | None = None  # this process's, while it works
        self._frames_failing = False  # logged once per outage, not once per frame
        # the storage's client: short waits, so an outage answers 503 at once
        self.connection = redis_storage.client(uri)
        self.queue = Queue(name, connection=self.connection)

    @property
    def stopping(self) -> bool:
        """Whether this process's worker was asked to stop (SIGTERM, a deploy): its run
        hands the job back at its next frame, rather than holding the stop up."""
        worker = self._worker
        return bool(worker is not None and getattr(worker, "asked_to_stop", False))

    @staticmethod
    def rq_id(job_id: str, attempt: int) -> str:
        return f"{job_id}-{attempt}"

    @staticmethod
    def run_of(rq_id: str) -> tuple[str, int] | None:
        """The job id and attempt of an RQ job's id (None: not one of ours)."""
        job_id, _, attempt = rq_id.rpartition("-")
        return (job_id, int(attempt)) if job_id and attempt.isdigit() else None

    @_reaching
    def enqueue(self, job_id: str, attempt: int = 0) -> None:
        waiting = self.queue.count
        if waiting >= self.max_queue:
            raise _full(waiting)
        # RQ's own timeout is a backstop: run_job stops at the job timeout itself
        self.queue.enqueue(ENTRY_POINT, job_id, job_id=self.rq_id(job_id, attempt),
                           job_timeout=self.job_timeout + 60, result_ttl=0,
                           failure_ttl=self.ttl, ttl=self.ttl)

    def cancel(self, job_id: str, attempt: int = 0) -> None:
        import redis
        from rq.command import send_stop_job_command
        from rq.exceptions import InvalidJobOperation, NoSuchJobError
        from rq.job import Job, JobStatus

        try:
            job = Job.fetch(self.rq_id(job_id, attempt), connection=self.connection)
            if job.get_status() == JobStatus.QUEUED:
                job.cancel()
            elif job.get_status() == JobStatus.STARTED:
                send_stop_job_command(self.connection, job.id)  # the flag is the real stop
        except (NoSuchJobError, InvalidJobOperation):
            pass
        except (redis.RedisError, OSError) as exc:
            log.warning("flask_animegan: could not reach the job queue to cancel (%s); the "
                        "worker stops at its next frame", type(exc).__name__)

    @_reaching
    def queued_count(self) -> int:
        return int(self.queue.count)

    def run_pending(self, job_id: str, attempt: int) -> bool:
        import redis
        from rq.exceptions import NoSuchJobError
        from rq.job import Job, JobStatus

        try:
            job = Job.fetch(self.rq_id(job_id, attempt), connection=self.connection)
            status = job.get_status()
        except NoSuchJobError:
            return False  # expired, or ended without running it (its result is not kept)
        except (redis.RedisError, OSError):
            return True
        return status in (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED,
                          JobStatus.DEFERRED)

    @_reaching
    def live_workers(self) -> int:
        from rq import Worker

        cutoff = time.time() - self.worker_timeout
        return sum(1 for worker in Worker.all(queue=self.queue)
                   if worker.last_heartbeat is not None
                   and worker.last_heartbeat.timestamp() >= cutoff)

    @_reaching
    def oldest_wait(self) -> float | None:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        for rq_id in self.queue.get_job_ids(0, 4):  # the first may be a cancelled leftover
            try:
                enqueued = Job.fetch(rq_id, connection=self.connection).enqueued_at
            except NoSuchJobError:
                continue
            if enqueued is not None:
                return max(0.0, time.time() - enqueued.timestamp())
        return None

    @property
    def _frames_key(self) -> str:
        return f"animegan:frames:{self.name}"

    def frames_converted(self, count: int) -> None:
        import redis

        if count <= 0:
            return
        bucket = f"{self._frames_key}:{int(time.time()) // FRAME_BUCKET_S}"
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.incrby(self._frames_key, count)
                pipe.incrby(bucket, count)
                pipe.expire(bucket, 3 * FRAME_RATE_WINDOW_S)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            if not self._frames_failing:
                log.warning("flask_animegan: frames converted could not be counted in Redis "
                            "(%s); the metrics miss them until it answers", type(exc).__name__)
            self._frames_failing = True
        else:
            self._frames_failing = False

    def _frame_counts(self) -> tuple[int, float]:
        """The frames converted by every worker of the queue, and per second lately."""
        now = time.time()
        first = int(now) // FRAME_BUCKET_S - FRAME_RATE_WINDOW_S // FRAME_BUCKET_S + 1
        buckets = [f"{self._frames_key}:{n}" for n in range(first, first + FRAME_RATE_WINDOW_S
                                                              // FRAME_BUCKET_S)]
        total, *counts = self.connection.mget([self._frames_key, *buckets])
        recent = sum(int(count) for count in counts if count is not None)
        return int(total or 0), _per_second(recent, now - first * FRAME_BUCKET_S)

    def status(self) -> dict[str, Any]:
        import redis

        try:
            total, per_second = self._frame_counts()
            return {"kind": self.kind, "name": self.name, "ok": True,
                    "queued": self.queued_count(), "max_queue": self.max_queue,
                    "workers": self.live_workers(),
                    # no cleanup here: it would fail abandoned runs without our handler
                    "running": self.queue.started_job_registry.get_job_count(cleanup=False),
                    "oldest_queued_s": _rounded(self.oldest_wait()), "frames_total": total,
                    "frames_per_second": per_second}
        except (redis.RedisError, OSError, StorageUnavailable) as exc:
            cause = exc.__cause__ or exc  # the Redis error behind a StorageUnavailable
            return {"kind": self.kind, "name": self.name, "ok": False,
                    "error": type(cause).__name__, "max_queue": self.max_queue}

    def make_worker(self, name: str | None = None) -> SimpleWorker:
        """An RQ worker on this queue whose runs expire in RQ's registry when not beaten
        for the worker timeout less a beat; ``SimpleWorker`` does not fork, so the model
        stays warm. Its failed runs pass through :meth:`_on_failure`."""
        import redis
        from rq import SimpleWorker
        from rq.job import Job

        # the sweep, every beat at most, finds a run expired: so it is queued again
        # within the worker timeout of its last beat
        execution_ttl = self.worker_timeout - self.beat

        class BeatingWorker(SimpleWorker):
            asked_to_stop = False  # SIGTERM or SIGINT: a warm shutdown, not a fault

            def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
                return execution_ttl

            def handle_warm_shutdown_request(self) -> None:
                self.asked_to_stop = True
                super().handle_warm_shutdown_request()  # type: ignore[no-untyped-call]

            def unsubscribe(self) -> None:
                # RQ closes its pubsub connection while the thread listening on it may be
                # in a read of up to 60 s, which the close can wait for: a worker that
                # stops must not hang there, and exiting needs nothing the close does
                closing = threading.Thread(target=super().unsubscribe, daemon=True,
                                           name="animegan-unsubscribe")
                closing.start()
                closing.join(UNSUBSCRIBE_WAIT)

        # a client of its own: RQ raises its socket timeout above its blocking wait for
        # jobs, which the shared client's short timeouts must not get
        connection = redis.Redis.from_url(self.uri)
        worker = BeatingWorker([self.name], connection=connection, name=name)
        # RQ's own cleanup of its registries hands abandoned runs to us too
        worker.push_exc_handler(self._on_failure)  # type: ignore[no-untyped-call]
        return worker

    def work(self, *, burst: bool = False, name: str | None = None) -> None:
        """Run jobs here until stopped. The sweep's thread beats for the worker and its
        run (RQ's ``SimpleWorker`` does not while a job runs). When RQ's worker quits on a
        fault (Redis gone mid-job), wait for Redis and start it again in this process."""
        import redis

        pause = 1.0  # between two starts: a fault that is not Redis's must not spin
        while True:
            worker = self._worker = self.make_worker(name)
            self.start_sweeping()
            started, failed = time.monotonic(), None
            try:
                self._clear_stale(worker)
                worker.work(burst=burst, logging_level="INFO")
            except (redis.RedisError, OSError) as exc:  # RQ's teardown, with Redis gone
                failed = exc
            finally:
                self._worker = None
            if getattr(worker, "asked_to_stop", False) or (burst and failed is None):
                return
            log.warning("flask_animegan: the worker %s stopped on a fault (%s); it starts "
                        "again once Redis answers", worker.name,
                        type(failed).__name__ if failed else "see RQ's log above")
            pause = 1.0 if time.monotonic() - started > 60 else min(pause * 2, 10.0)
            if not self._wait_for_redis(pause):
                return

    def _wait_for_redis(self, pause: float) -> bool:
        """Wait ``pause``, then until Redis answers (backoff to 10 s, logged once a minute);
        False when SIGTERM or SIGINT came meanwhile."""
        import signal

        import redis

        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: stop.set())
        since = time.monotonic()
        logged = since
        while not stop.wait(pause):
            try:
                self.connection.ping()
                log.warning("flask_animegan: the job queue's Redis answers again after %.0f s",
                            time.monotonic() - since)
                return True
            except (redis.RedisError, OSError) as exc:
                if time.monotonic() - logged >= 60:
                    logged = time.monotonic()
                    log.warning("flask_animegan: still waiting for the job queue's Redis "
                                "(%s, %.0f s)", type(exc).__name__, logged - since)
            pause = min(pause * 2, 10.0)
        return False

    def _clear_stale(self, worker: SimpleWorker) -> None:
        """Clear the registration of a dead worker with this one's name (killed, or this
        process's before a fault), so RQ does not refuse the name: dead when it was on this
        host with a pid that is gone or ours, or has not beaten within the worker timeout."""
        from rq import Worker

        stale = Worker.find_by_key(worker.key, connection=worker.connection)
        if stale is None or stale.connection.hexists(stale.key, "death"):
            return
        beat = stale.last_heartbeat
        silent = beat is None or time.time() - beat.timestamp() > self.worker_timeout
        gone = stale.hostname == socket.gethostname() and (
            stale.pid == os.getpid() or not process_alive(stale.pid))
        if silent or gone:
            log.warning("flask_animegan: cleared the registration of the dead worker %s "
                        "(pid %s on %s) to start under its name", stale.name, stale.pid,
                        stale.hostname)
            stale.register_death()  # type: ignore[no-untyped-call]

    def _tick(self) -> None:
        """Beat for this process's worker (and its run), then hand expired runs back."""
        worker = self._worker
        if worker is None or worker.birth_date is None:
            return  # not registered yet: a beat now would make RQ refuse the name
        executions = getattr(worker, "executions", None)
        if executions is None:  # RQ 2: one run, beaten by maintain_heartbeats(job)
            execution = worker.execution
            if execution is not None:
                worker.maintain_heartbeats(execution.job)  # type: ignore[call-arg]
        else:  # RQ 3: a copy of the main thread's dict, which may change meanwhile
            execution = next(iter(list(executions.values())), None)
            if execution is not None:
                worker.maintain_heartbeats(execution.job, execution)
        if execution is None:
            worker.heartbeat()
        self.queue.started_job_registry.cleanup(exception_handlers=[self._on_failure])

    def _on_failure(self, job: Any, exc_type: type[BaseException], *_: Any) -> None:
        """RQ's handler of a failed run: one given up as abandoned goes to ``when_abandoned``."""
        from rq.exceptions import AbandonedJobError

        run = self.run_of(job.id)
        if run is not None and exc_type is AbandonedJobError and self._abandoned is not None:
            self._abandoned(*run)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def _per_second(frames: int, seconds: float) -> float:
    return round(frames / seconds, 2) if seconds > 0 else 0.0


class _FrameBuckets:
    """The local queue's count of frames converted: a total, and per-bucket counts of the
    last window (as RQQueue keeps them in Redis)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self._buckets: dict[int, int] = {}

    def add(self, count: int, now: float) -> None:
        if count <= 0:
            return
        bucket = int(now) // FRAME_BUCKET_S
        with self._lock:
            self.total += count
            self._buckets[bucket] = self._buckets.get(bucket, 0) + count
            for old in [b for b in self._buckets if b < bucket - FRAME_RATE_WINDOW_S
                        // FRAME_BUCKET_S]:
                del self._buckets[old]

    def read(self, now: float) -> tuple[int, float]:
        """The total, and the frames per second over the window's buckets to now."""
        first = int(now) // FRAME_BUCKET_S - FRAME_RATE_WINDOW_S // FRAME_BUCKET_S + 1
        with self._lock:
            recent = sum(n for bucket, n in self._buckets.items() if bucket >= first)
            total = self.total
        return total, _per_second(recent, now - first * FRAME_BUCKET_S)


def open_queue(settings: Settings, uri: str, runner: Callable[[str], None]) -> JobQueue:
    """The queue ANIMEGAN_JOB_QUEUE names (``auto``: RQ when the jobs' storage is Redis);
    ``uri`` is the state storage's; :class:`SettingError` for ``rq`` without a Redis or
    without the ``rq`` package."""
    kind = settings.job_queue_kind
    if kind == "local":
        return LocalQueue(runner, max_queue=settings.job_max_queue)
    if not is_redis(uri):
        raise SettingError("ANIMEGAN_JOB_QUEUE", (
            "ANIMEGAN_JOB_QUEUE='rq' needs a Redis for the queue: set "
            "ANIMEGAN_STATE_STORAGE_URI (or ANIMEGAN_STORAGE_URI) to redis://host:6380/0, "
            "or use 'local' (one in-process worker, single machine) or 'auto'"))
    try:
        return RQQueue(uri, max_queue=settings.job_max_queue,
                       job_timeout=settings.job_timeout, ttl=settings.result_ttl,
                       worker_timeout=settings.job_worker_timeout,
                       beat=settings.job_worker_beat)
    except ImportError:
        raise SettingError("ANIMEGAN_JOB_QUEUE", (
            "jobs on Redis need RQ: pip install 'flask-animegan[jobs]', or set "
            "ANIMEGAN_JOB_QUEUE=local")) from None
