"""gunicorn settings for serving an app with flask_animegan, shipped in the package:

    gunicorn -c python:flask_animegan.gunicorn_conf yourapp:app

One worker holds one copy of the model and runs one inference at a time with every core;
a few threads accept uploads meanwhile. gunicorn's own flags and ``GUNICORN_CMD_ARGS`` win.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterable
from typing import Any

from gunicorn.glogging import Logger

from flask_animegan.config import (
    DEFAULTS,
    GRACEFUL_TIMEOUT,
    SPARE_READERS,
    WORKER_TIMEOUT,
    ServerSettings,
    available_cpus,
    from_environ,
    gunicorn_overrides,
)

# Only the app settings this file needs: the app reads (and warns about) the rest itself.
_APP = from_environ({key: value for key, value in os.environ.items() if key in (
    "ANIMEGAN_TORCH_THREADS", "ANIMEGAN_METRICS", "ANIMEGAN_MAX_QUEUE")})
_SERVER = ServerSettings.from_environ()

# The math libraries size their threadpools when torch is imported (by the worker).
_threads = _APP.get("ANIMEGAN_TORCH_THREADS") or available_cpus()
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, str(_threads))

# Prometheus metrics from several processes: prometheus_client's multiprocess mode keeps
# each worker's values in one folder, set before any worker imports it, emptied at start.
_METRICS = _APP.get("ANIMEGAN_METRICS", False)
if _METRICS and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    import tempfile

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="animegan-metrics-")

bind = "127.0.0.1:8000"
workers = 1
worker_class = "gthread"
_max_queue = _APP.get("ANIMEGAN_MAX_QUEUE", DEFAULTS["ANIMEGAN_MAX_QUEUE"])
# one thread per conversion admitted at once (1 + the queue), as many for the uploads
# arriving for them plus SPARE_READERS for slow clients, one for /healthz and the pages
threads = _SERVER.server_threads or 2 * (_max_queue + 1) + SPARE_READERS + 1
# A 1024-px conversion on a slow CPU plus a queue of them: allow minutes, not 30 s.
timeout, graceful_timeout = WORKER_TIMEOUT, GRACEFUL_TIMEOUT
# Slow clients: gthread parks a connection until its first byte, but then reads the head
# with no time limit; here only its size is bounded. The app cuts a body that arrives too
# slowly (web/bodies.py); bounding the head's time needs nginx in front (deploy/nginx.conf).
keepalive = 5
limit_request_line = 8190  # method, path and query
limit_request_fields = 100
limit_request_field_size = 8190  # one header line
accesslog = _SERVER.access_log or None  # empty: no access log
errorlog = "-"
loglevel = "info"
# gunicorn 27 opens a control socket at one path per user, so a second instance would
# take the first's over: off unless ANIMEGAN_CONTROL_SOCKET gives this one its own path.
control_socket_disable = not _SERVER.control_socket
if _SERVER.control_socket:
    control_socket = _SERVER.control_socket
globals().update(gunicorn_overrides())  # old names (ANIMEGAN_BIND...), for one release

# A result page's URL (/animegan/result/<token>) is a capability: never logged.
_RESULT_TOKEN = re.compile(r"(/result/)[^/?#\s\"]+")


class RedactingLogger(Logger):  # type: ignore[misc]  # gunicorn has no type hints
    """gunicorn's logger, with result tokens ``<redacted>`` in the access log."""

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any],
              request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return {key: _RESULT_TOKEN.sub(r"\1<redacted>", value) if isinstance(value, str) else value
                for key, value in atoms.items()}


logger_class = RedactingLogger


def post_fork(server: Any, worker: Any) -> None:
    _log_the_package_to_the_error_log(server)
    _keep_the_heap_flat()
    from flask_animegan.process import configure_process

    configure_process(_threads)
    if getattr(worker, "animegan_replaces", ()):
        _keep_the_old_workers_if_loading_fails(worker)


def post_worker_init(worker: Any) -> None:
    """Warm up the model: a worker started by a reload warms up first, then stops the old
    worker it replaces; any other warms up while it answers (503 till ready)."""
    from flask_animegan.service import warm_up_all

    _check_threads(worker)
    replaces = getattr(worker, "animegan_replaces", ())
    if not replaces:
        # No old worker serves meanwhile: one worker answers 503 while it warms up (nginx
        # tries another instance); of several, each warms up first, the others serving.
        warm_up_all(background=worker.cfg.workers == 1)
        return
    try:
        warm_up_all()
        problem = _not_ready(worker)
    except Exception as error:  # at a reload an old worker still serves: keep it
        worker.log.exception("reload: the new worker's warm-up failed")
        problem = f"its warm-up failed ({type(error).__name__}: {error})"
    if problem:
        _leave(worker, problem)
    if worker.alive:  # not told to stop while it warmed up
        _retire(worker, replaces)


# --- reloads keep serving -------------------------------------------------------------
# on_reload raises num_workers so that the old workers stay; each new worker, once warmed
# up, sends its old ones the SIGTERM gunicorn would have sent at once, and child_exit
# brings num_workers back down (docs/deployment.md).


def _handover(server: Any) -> dict[str, Any]:
    """The reload's bookkeeping on the master: old workers to retire, each new one's share."""
    handover: dict[str, Any] = server.__dict__.setdefault(
        "_animegan_handover", {"retiring": set(), "shares": []})
    return handover


def on_reload(server: Any) -> None:
    old = sorted(server.WORKERS, key=lambda pid: server.WORKERS[pid].age)
    handover = _handover(server)
    handover["retiring"].update(old)
    new = max(server.cfg.workers, 1)
    handover["shares"] = [tuple(old[index::new]) for index in range(new)]
    server.num_workers = len(server.WORKERS) + new
    server.log.info("reload: old worker(s) %s serve until the new one(s) have warmed up",
                    _pids(old))


def pre_fork(server: Any, worker: Any) -> None:
    """A worker forked by a reload learns which old workers it replaces."""
    shares = _handover(server)["shares"]
    worker.animegan_replaces = shares.pop(0) if shares else ()


def _keep_the_old_workers_if_loading_fails(worker: Any) -> None:
    """At a reload, a new worker that cannot load the app exits with 1, not gunicorn's
    boot-error code (which would stop the master, old workers and all)."""
    load = worker.load_wsgi

    def load_or_leave() -> None:
        try:
            load()
        except Exception as error:
            worker.log.exception("reload: the new worker could not load the app")
            _leave(worker, f"it could not load the app ({type(error).__name__}: {error})")

    worker.load_wsgi = load_or_leave


def _leave(worker: Any, problem: str) -> None:
    """End a new worker that cannot take over; its old workers keep serving."""
    worker.log.error("reload: new worker %s is not ready: %s; old worker(s) %s keep "
                     "serving. Fix that and reload again.", worker.pid, problem,
                     _pids(worker.animegan_replaces))
    sys.exit(1)  # exit code 1, not gunicorn's boot error: that would stop the master


def _not_ready(worker: Any) -> str | None:
    """Why a warmed-up worker cannot replace a working one (no usable default style), or None."""
    service = getattr(worker.wsgi, "extensions", {}).get("animegan")
    if service is not None and service.model is None:
        return "its default style is not usable (see the warning above)"
    return None


def _retire(worker: Any, pids: Iterable[int]) -> None:
    """Stop the old workers ``pids`` (the new worker's siblings) gracefully."""
    for pid in pids:
        if _is_child_of(pid, worker.ppid):
            os.kill(pid, signal.SIGTERM)
    worker.log.info("reload: new worker %s is ready; old worker(s) %s stop after the "
                    "requests they have in progress", worker.pid, _pids(pids))


def _is_child_of(pid: int, parent: int) -> bool:
    """Whether process ``pid`` still runs and is ``parent``'s child (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: trust the pid
        return True
    return int(fields[1]) == parent


def _after_reload_exit(server: Any, worker: Any) -> None:
    """A worker exited during a reload's handover: an old one is one fewer to keep; a new
    one that exited before it took over leaves its old ones serving, for good."""
    handover = _handover(server)
    if worker.pid in handover["retiring"]:
        handover["retiring"].discard(worker.pid)
        server.num_workers = max(server.num_workers - 1, 1)
        return
    orphaned = [pid for pid in getattr(worker, "animegan_replaces", ())
                if pid in handover["retiring"]]
    if not orphaned:
        return
    server.num_workers = max(server.num_workers - 1, 1)
    still_replaced = {pid for other in server.WORKERS.values()
                      for pid in getattr(other, "animegan_replaces", ())}
    handover["retiring"].difference_update(set(orphaned) - still_replaced)
    server.log.error("reload: new worker %s exited before it was ready; old worker(s) %s "
                     "keep serving (the reason is in the log above). Fix it and reload "
                     "again.", worker.pid, _pids(orphaned))


def _pids(pids: Iterable[int]) -> str:
    return ", ".join(map(str, pids)) or "(none)"


def _check_threads(worker: Any) -> None:
    """Stop the server (a boot error) with too few threads for the conversions admitted."""
    from gunicorn.arbiter import Arbiter

    from flask_animegan.service import admitted_at_once

    admitted, threads = admitted_at_once(), worker.cfg.threads
    if threads > admitted:
        return
    worker.log.error(
        "%s threads (ANIMEGAN_SERVER_THREADS or --threads) cannot keep a thread free for "
        "/healthz and the pages: the app lets %s requests hold a thread at once (1 + "
        "ANIMEGAN_MAX_QUEUE conversions, and as many uploads arriving plus %s). Set "
        "ANIMEGAN_SERVER_THREADS to %s or more (unset: 2 × (ANIMEGAN_MAX_QUEUE + 1) + %s), "
        "or lower ANIMEGAN_MAX_QUEUE.",
        threads, admitted, SPARE_READERS, admitted + 1, SPARE_READERS + 1)
    sys.exit(Arbiter.WORKER_BOOT_ERROR)


def _log_the_package_to_the_error_log(server: Any) -> None:
    """Send flask_animegan's lines to gunicorn's error log, unless a logging config did."""
    import logging

    package = logging.getLogger("flask_animegan")
    if package.handlers:
        return
    for handler in server.log.error_log.handlers:
        package.addHandler(handler)
    package.setLevel(server.log.error_log.level)
    package.propagate = False  # a root handler from a logging config would repeat them


def _keep_the_heap_flat() -> None:
    """Keep the worker's memory flat: glibc otherwise raises its mmap threshold after the
    first large tensors are freed and later ones fragment the heap (docs/deployment.md)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-8, 2)  # M_ARENA_MAX


def on_starting(server: Any) -> None:
    """Empty the metrics folder (old files would be summed in); keep off a live control socket."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if _METRICS and folder:
        import glob

        os.makedirs(folder, exist_ok=True)
        for path in glob.glob(os.path.join(folder, "*.db")):
            os.remove(path)
    _keep_off_a_live_control_socket(server)


def _keep_off_a_live_control_socket(server: Any) -> None:
    """A second instance given a live ANIMEGAN_CONTROL_SOCKET runs without one."""
    # gunicorn before 27 has no control socket (nor these settings)
    if "control_socket_disable" not in server.cfg.settings or server.cfg.control_socket_disable:
        return
    import socket

    path = os.path.abspath(server.cfg.control_socket)
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(path)
        except OSError:  # nothing there, or a file left by a killed instance: ours
            return
    server.log.warning("control socket %s belongs to a running gunicorn; this one runs "
                       "without one (give it its own ANIMEGAN_CONTROL_SOCKET)", path)
    server.cfg.set("control_socket_disable", True)


def child_exit(server: Any, worker: Any) -> None:
    """The reload's handover counts the exited worker, and its live gauges end with it."""
    _after_reload_exit(server, worker)
    if _METRICS and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
