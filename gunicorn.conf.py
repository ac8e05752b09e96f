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
# this mirrors flask_animegan.config.torch_threads in two lines.
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
keepalive = 5
# Bound what a client can send in headers; the body limit is ANIMEGAN_MAX_UPLOAD_BYTES.
limit_request_line = 8190
limit_request_fields = 100
accesslog = os.environ.get("ANIMEGAN_ACCESS_LOG", "-") or None  # empty: no access log
errorlog = "-"
loglevel = os.environ.get("ANIMEGAN_LOG_LEVEL", "info")


def post_fork(server, worker):
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
    """Start metrics from zero: files left by an earlier run would be summed in."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if _METRICS and folder:
        import glob

        os.makedirs(folder, exist_ok=True)
        for path in glob.glob(os.path.join(folder, "*.db")):
            os.remove(path)


def child_exit(server, worker):
    """A worker's gauges of the "live" kinds (queue depth, ...) end with it."""
    if _METRICS and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
