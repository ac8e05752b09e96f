"""The performance benchmark: ``python -m bench`` (``--quick`` for a smoke run).

Every figure is measured in one run on one machine and compared as ratios. Imports
nothing heavy, so gunicorn loads the baseline apps (``bench.baseline_*:app``) cheaply.
"""
