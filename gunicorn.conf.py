"""gunicorn settings for serving an app with flask_animegan (the example app by default).

    gunicorn -c gunicorn.conf.py example_app:app

One worker process holds one copy of the model and runs one inference at a time
with every core; a few threads accept uploads, decode and encode meanwhile, and
queue for the model (ANIMEGAN_MAX_QUEUE). Every value can be set from the
environment; gunicorn's own command-line flags (-b, -w, --threads) override them.
"""

import os

# Cap the math libraries to the CPUs this process may use *before* torch is
# imported (the worker imports it when it loads the app): the threadpools size
# themselves at import time. Importing flask_animegan here would import torch, so
# this mirrors flask_animegan.config.Settings.threads in one line.
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
threads = int(os.environ.get("ANIMEGAN_THREADS", "4"))
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
loglevel = os.environ.get("ANIMEGAN_LOG_LEVEL", "info")

# gunicorn 27 opens a control socket for `gunicornc` (show workers, add or remove them,
# reload, shut down) at one path per user ($XDG_RUNTIME_DIR/gunicorn.ctl or
# ~/.gunicorn/gunicorn.ctl), so a second instance takes the first's over and deletes it
# when it stops. Off unless ANIMEGAN_CONTROL_SOCKET gives this instance a path of its own.
_control_socket = os.environ.get("ANIMEGAN_CONTROL_SOCKET", "").strip()
control_socket_disable = not _control_socket
if _control_socket:
    control_socket = _control_socket


def post_fork(server, worker):
    """Runs in each new worker before it loads the app."""
    _log_the_package_to_the_error_log(server)
    _keep_the_heap_flat()
    from flask_animegan.process import configure_process

    configure_process(int(_threads))


def post_worker_init(worker):
    """Runs in each worker after it loaded the app and before it takes requests: load
    and warm up the model there, so the first request is as fast as the next ones
    (``init_app`` itself loads nothing, which keeps `flask` CLI commands quick)."""
    from flask_animegan.service import warm_up_all

    warm_up_all()


def _log_the_package_to_the_error_log(server):
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


def _keep_the_heap_flat():
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


def on_starting(server):
    """Runs in the master before it binds and forks."""
    _clear_metrics()
    _keep_off_a_live_control_socket(server)


def _clear_metrics():
    """Start metrics from zero: files left by an earlier run would be summed in."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if _METRICS and folder:
        import glob

        os.makedirs(folder, exist_ok=True)
        for path in glob.glob(os.path.join(folder, "*.db")):
            os.remove(path)


def _keep_off_a_live_control_socket(server):
    """Two instances given one ANIMEGAN_CONTROL_SOCKET: gunicorn would let the second
    take the first's socket over (and delete it when it stops). It runs without one."""
    if server.cfg.control_socket_disable:
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


def child_exit(server, worker):
    """A worker's gauges of the "live" kinds (queue depth, ...) end with it."""
    if _METRICS and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
