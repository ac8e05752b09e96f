"""gunicorn settings for serving an app with flask_animegan, shipped in the package:

    gunicorn -c python:flask_animegan.gunicorn_conf yourapp:app

(the repository's ``gunicorn.conf.py`` imports this module, so
``gunicorn -c gunicorn.conf.py example_app:app`` serves with the same settings).

One worker process holds one copy of the model and runs one inference at a time
with every core; a few threads accept uploads, decode and encode meanwhile, and
queue for the model (ANIMEGAN_MAX_QUEUE). Every value can be set from the
environment; gunicorn's own command-line flags (-b, -w, --threads) override them.

Importing this module imports neither torch nor Flask (``flask_animegan/__init__.py``
imports its names on first use): the thread caps below must be set before torch is
imported. gunicorn reads the module once; at a reload (HUP) it keeps the values it read.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterable
from typing import Any

from gunicorn.glogging import Logger

# Cap the math libraries to the CPUs this process may use *before* torch is
# imported (the worker imports it when it loads the app): the threadpools size
# themselves at import time. This mirrors flask_animegan.config.Settings.threads in
# one line, so that nothing of the package is imported before the caps are set.
_threads = os.environ.get("ANIMEGAN_TORCH_THREADS") or str(len(os.sched_getaffinity(0)))
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, _threads)

# Prometheus metrics (ANIMEGAN_METRICS) from several processes: prometheus_client's
# multiprocess mode keeps each worker's values in files in one folder, which must be
# set before any worker imports prometheus_client and be emptied at each start.
_METRICS = os.environ.get("ANIMEGAN_METRICS", "").strip().lower() in ("1", "true", "yes", "on")
if _METRICS and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    import tempfile

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="animegan-metrics-")

bind = os.environ.get("ANIMEGAN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("ANIMEGAN_WORKERS", "1"))


def _default_threads() -> int:
    """One thread per conversion the app admits at once (one running, ANIMEGAN_MAX_QUEUE
    more: flask_animegan/runtime/admission.py), and one more for /healthz and the pages.
    Read from the environment as the example app reads it, without importing
    flask_animegan (that imports torch); a value the app cannot use stops it at start."""
    try:
        max_queue = int(os.environ.get("ANIMEGAN_MAX_QUEUE", "").strip() or "2")
    except ValueError:
        max_queue = 2
    return 1 + max_queue + 1


threads = int(os.environ.get("ANIMEGAN_THREADS") or _default_threads())
worker_class = "gthread"
# A 1024-px conversion on a slow CPU plus a queue of them: allow minutes, not 30 s.
timeout = int(os.environ.get("ANIMEGAN_WORKER_TIMEOUT", "120"))
graceful_timeout = int(os.environ.get("ANIMEGAN_GRACEFUL_TIMEOUT", "60"))
# Slow clients. A connection that sends nothing takes no thread: gthread waits 5 s for
# its first byte, then parks it and closes it `keepalive` seconds later, as it does idle
# keep-alive connections. But once a request's first byte arrives, one thread reads its
# head and the app reads its body with no time limit, so a client trickling a byte a
# second holds a thread as long as it likes; `timeout` does not end that (it restarts a
# worker whose main loop stops, and that loop runs whatever the threads do). Here we can
# only bound the head's size (the body's is ANIMEGAN_MAX_UPLOAD_BYTES); bounding time
# needs nginx in front (deploy/nginx.conf).
keepalive = 5
limit_request_line = 8190  # method, path and query
limit_request_fields = 100
limit_request_field_size = 8190  # one header line
accesslog = os.environ.get("ANIMEGAN_ACCESS_LOG", "-") or None  # empty: no access log
errorlog = "-"

# A result page's URL (/animegan/result/<token>, and its /anime and /original images) is
# a capability: whoever has it sees the picture. The access log writes the token nowhere.
_RESULT_TOKEN = re.compile(r"(/result/)[^/?#\s\"]+")


class RedactingLogger(Logger):  # type: ignore[misc]  # gunicorn has no type hints
    """gunicorn's logger, with result tokens replaced by ``<redacted>`` in every atom of
    the access log (the request line, the path, the referer, any header or environ
    value a custom access_log_format names)."""

    def atoms(self, resp: Any, req: Any, environ: dict[str, Any],
              request_time: Any) -> dict[str, Any]:
        atoms: dict[str, Any] = super().atoms(resp, req, environ, request_time)
        return {key: _RESULT_TOKEN.sub(r"\1<redacted>", value) if isinstance(value, str) else value
                for key, value in atoms.items()}


logger_class = RedactingLogger
loglevel = os.environ.get("ANIMEGAN_LOG_LEVEL", "info")

# gunicorn 27 opens a control socket for `gunicornc` (show workers, add or remove them,
# reload, shut down) at one path per user ($XDG_RUNTIME_DIR/gunicorn.ctl or
# ~/.gunicorn/gunicorn.ctl), so a second instance takes the first's over and deletes it
# when it stops. Off unless ANIMEGAN_CONTROL_SOCKET gives this instance a path of its own.
_control_socket = os.environ.get("ANIMEGAN_CONTROL_SOCKET", "").strip()
control_socket_disable = not _control_socket
if _control_socket:
    control_socket = _control_socket


def post_fork(server: Any, worker: Any) -> None:
    """Runs in each new worker before it loads the app."""
    _log_the_package_to_the_error_log(server)
    _keep_the_heap_flat()
    from flask_animegan.process import configure_process

    configure_process(int(_threads))
    if getattr(worker, "animegan_replaces", ()):
        _keep_the_old_workers_if_loading_fails(worker)


def post_worker_init(worker: Any) -> None:
    """Runs in each worker after it loaded the app and before it takes requests: load
    and warm up the model, so the first conversion is as fast as the next ones
    (``init_app`` itself loads nothing, which keeps `flask` CLI commands quick). A worker
    started by a reload warms up first, then stops the old worker it replaces; any other
    warms up in the background while it already answers (503 until it is ready)."""
    from flask_animegan.service import warm_up_all

    _check_threads(worker)
    replaces = getattr(worker, "animegan_replaces", ())
    if not replaces:
        # No old worker serves meanwhile (a first start, a restart, a respawn): with one
        # worker (the default), take requests at once and warm up in a thread; until it
        # is done, conversions and /healthz answer 503 with Retry-After, so nginx tries
        # another instance instead of leaving requests in this one's backlog. With
        # several, a worker warms up first, as at a reload: the others serve meanwhile,
        # and a warming worker's 503s would reach clients that gunicorn gave it.
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
# On HUP (the unit's ExecReload) gunicorn re-reads this file, forks new workers and at once
# stops the old ones (Arbiter.reload: manage_workers stops the oldest beyond num_workers),
# and a new worker accepts nothing until post_worker_init, the warm-up, has finished: the
# instance would be silent for the whole warm-up. Instead on_reload raises num_workers so
# that gunicorn keeps the old workers; each new worker, once warmed up, stops the old ones
# it replaces with the SIGTERM gunicorn would have sent (they finish the requests in
# progress); child_exit brings num_workers back down as they go. The new worker signals
# them itself rather than asking the master (SIGTTOU): Arbiter.reload waits in a loop, up
# to graceful_timeout, for the old workers to exit, handling no signal meanwhile. The state
# lives on the master's Arbiter, since each reload runs this file again.


def _handover(server: Any) -> dict[str, Any]:
    """The reload's bookkeeping on the master: old workers to retire, and the share of
    them each new worker replaces (handed out in pre_fork)."""
    handover: dict[str, Any] = server.__dict__.setdefault(
        "_animegan_handover", {"retiring": set(), "shares": []})
    return handover


def on_reload(server: Any) -> None:
    """Runs in the master on HUP, after this file was read again, before the new
    workers are forked."""
    old = sorted(server.WORKERS, key=lambda pid: server.WORKERS[pid].age)
    handover = _handover(server)
    handover["retiring"].update(old)
    new = max(server.cfg.workers, 1)
    handover["shares"] = [tuple(old[index::new]) for index in range(new)]
    server.num_workers = len(server.WORKERS) + new
    server.log.info("reload: old worker(s) %s serve until the new one(s) have warmed up",
                    _pids(old))


def pre_fork(server: Any, worker: Any) -> None:
    """Runs in the master before each fork: a worker forked by a reload learns which old
    workers it replaces."""
    shares = _handover(server)["shares"]
    worker.animegan_replaces = shares.pop(0) if shares else ()


def _keep_the_old_workers_if_loading_fails(worker: Any) -> None:
    """A new worker that cannot load the app (an import error in a new deploy) would exit
    with gunicorn's boot-error code, and the master would then stop, old workers and all.
    At a reload it exits with 1 instead, and the old workers keep serving."""
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
    """Why a worker that warmed up cannot replace a working one, or None: an app whose
    default style is not usable (its /healthz would say no_model) answers 503 to every
    conversion, while the old worker still has its model in memory."""
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
    """In the master, when a worker exits during a reload's handover: an old one is one
    worker fewer to keep; a new one that exited before it took over (warm-up failed, hung
    past the worker timeout, killed) leaves its old ones serving, for good."""
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
    """Refuse to serve with too few threads: every conversion the app admits holds a
    thread from its first byte to its response, and one thread must stay free for
    /healthz and the pages (docs/deployment.md). Stops the server (a boot error)."""
    import sys

    from gunicorn.arbiter import Arbiter

    from flask_animegan.service import admitted_at_once

    admitted, threads = admitted_at_once(), worker.cfg.threads
    if threads > admitted:
        return
    worker.log.error(
        "%s threads (ANIMEGAN_THREADS or --threads) cannot keep a thread free for /healthz "
        "and the pages: the app admits %s conversions at once (1 + ANIMEGAN_MAX_QUEUE), "
        "each holding a thread. Set ANIMEGAN_THREADS to %s or more (unset, "
        "flask_animegan.gunicorn_conf derives ANIMEGAN_MAX_QUEUE + 2), or lower ANIMEGAN_MAX_QUEUE.",
        threads, admitted, admitted + 1)
    sys.exit(Arbiter.WORKER_BOOT_ERROR)


def _log_the_package_to_the_error_log(server: Any) -> None:
    """flask_animegan's lines (the style-loaded line at startup, one JSON line per
    conversion) go to gunicorn's error log at its level (ANIMEGAN_LOG_LEVEL), unless
    a logging config already gave that logger handlers of its own."""
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
    first large tensors are freed, and later ones then fragment the heap (RSS crept up
    about 13 % over the first 600 conversions in our soak test). A fixed 1 MiB threshold
    returns every large buffer to the OS; two arenas bound per-thread heaps."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return
    m_mmap_threshold, m_arena_max = -3, -8
    libc.mallopt(m_mmap_threshold, 1 << 20)
    libc.mallopt(m_arena_max, 2)


def on_starting(server: Any) -> None:
    """Runs in the master before it binds and forks."""
    _clear_metrics()
    _keep_off_a_live_control_socket(server)


def _clear_metrics() -> None:
    """Start metrics from zero: files left by an earlier run would be summed in."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if _METRICS and folder:
        import glob

        os.makedirs(folder, exist_ok=True)
        for path in glob.glob(os.path.join(folder, "*.db")):
            os.remove(path)


def _keep_off_a_live_control_socket(server: Any) -> None:
    """Two instances given one ANIMEGAN_CONTROL_SOCKET: gunicorn would let the second
    take the first's socket over (and delete it when it stops). It runs without one."""
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
    """Runs in the master when a worker has exited: the reload's handover counts it, and
    its gauges of the "live" kinds (queue depth, ...) end with it."""
    _after_reload_exit(server, worker)
    if _METRICS and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
