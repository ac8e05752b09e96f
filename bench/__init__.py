"""The performance benchmark of issue 4: ``python -m bench`` (``--quick`` for a smoke run).

Every figure is measured in the same run on the same machine and compared as ratios:
matmul ceilings, model compute per size and execution mode, the stages of one real
photo, the service under the real gunicorn against the articles' two recipes, the
cache, and the worker's memory. This package imports nothing heavy at import time,
so gunicorn can load the baseline apps (``bench.baseline_*:app``) cheaply.
"""
