"""Prometheus metrics (``ANIMEGAN_METRICS``) at ``{prefix}/metrics``. ``PROMETHEUS_MULTIPROC_DIR``
sums gunicorn's workers; without it each app has its own registry, so apps never mix counts."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

# size classes for the latency label: a label per size would let clients add series
SIZE_CLASSES = (128, 256, 512, 768, 1024, 2048)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


def size_class(long_side: int) -> str:
    """The smallest class >= the long side, as a label value ("512"), or "larger"."""
    for limit in SIZE_CLASSES:
        if long_side <= limit:
            return str(limit)
    return "larger"


class Metrics:
    """The extension's metrics; also receives the inference engine's events."""

    def __init__(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError:
            raise RuntimeError("ANIMEGAN_METRICS needs prometheus_client: "
                               "pip install 'flask-animegan[metrics]'") from None
        registry = self.registry = CollectorRegistry()
        self.requests = Counter(
            "animegan_requests", "Requests answered by the extension's routes.",
            ["endpoint", "status"], registry=registry)
        self.conversion_seconds = Histogram(
            "animegan_conversion_seconds",
            "Time to convert one upload (decode, cache, inference, encode), by style and "
            "long-side class of the output.",
            ["style", "size"], buckets=LATENCY_BUCKETS, registry=registry)
        self.stage_seconds = Histogram(
            "animegan_stage_seconds", "Time spent in each stage of a conversion.",
            ["stage"], buckets=STAGE_BUCKETS, registry=registry)
        self.queue_depth = Gauge(
            "animegan_queue_depth", "Conversions waiting for the model.",
            registry=registry, multiprocess_mode="livesum")
        self.in_flight = Gauge(
            "animegan_in_flight", "Conversions running on the model now.",
            registry=registry, multiprocess_mode="livesum")
        self.cache_lookups = Counter(
            "animegan_cache_lookups", "Result cache lookups, by result (hit or miss).",
            ["result"], registry=registry)
        self.cache_bytes = Gauge(
            "animegan_cache_bytes", "Bytes held by the result cache.",
            registry=registry, multiprocess_mode="livesum")
        self.rate_limited = Counter(
            "animegan_rate_limited", "Requests refused by the rate limit (429).",
            registry=registry)
        self.model_load_seconds = Gauge(
            "animegan_model_load_seconds", "Seconds the last load of a style's weights took.",
            ["style"], registry=registry, multiprocess_mode="max")

        self._jobs: JobQueueCollector | None = None

    def watch_jobs(self, status: Callable[[], dict[str, Any]]) -> None:
        """Read the job queue's status (:meth:`JobQueue.status`) at each scrape."""
        self._jobs = JobQueueCollector(status)
        self.registry.register(self._jobs)

    def queue_changed(self, in_flight: int, queued: int) -> None:
        self.in_flight.set(in_flight)
        self.queue_depth.set(queued)

    def model_loaded(self, style: str, seconds: float) -> None:
        self.model_load_seconds.labels(style).set(seconds)

    def request_done(self, endpoint: str | None, status: int) -> None:
        self.requests.labels(endpoint or "unknown", str(status)).inc()

    def conversion_done(self, conversion: Any, cache_enabled: bool,
                        cache_bytes: int | None) -> None:
        total = sum(conversion.timings.values()) / 1000
        self.conversion_seconds.labels(conversion.style,
                                       size_class(max(conversion.size))).observe(total)
        for stage, ms in conversion.timings.items():
            self.stage_seconds.labels(stage).observe(ms / 1000)
        if cache_enabled:
            self.cache_lookups.labels("hit" if conversion.cache_hit else "miss").inc()
            if cache_bytes is not None:  # None for Redis: its INFO memory tells
                self.cache_bytes.set(cache_bytes)

    def exposition(self) -> tuple[bytes, str]:
        """The text format of every value (summed over worker processes if multiprocess)."""
        from prometheus_client import (
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            generate_latest,
        )

        registry = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir"):
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            if self._jobs is not None:  # read from the queue, not summed over processes
                registry.register(self._jobs)
        return generate_latest(registry), CONTENT_TYPE_LATEST


class JobQueueCollector:
    """The job queue's gauges, read from its ``status()`` at each scrape (so a web process
    reports what workers on other machines do), labelled by the queue's name."""

    def __init__(self, status: Callable[[], dict[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        status = self._status()
        name = str(status.get("name") or status.get("kind") or "jobs")
        up = GaugeMetricFamily("animegan_job_queue_up",
                               "1 when the job queue answered this scrape, else 0.",
                               labels=["queue"])
        up.add_metric([name], 1 if status.get("ok") else 0)
        yield up
        if not status.get("ok"):
            return  # no stale values: the series are absent while the queue is unreachable
        gauges = (
            ("animegan_job_queued", "Jobs waiting for a worker.", status["queued"]),
            ("animegan_job_oldest_queued_seconds",
             "Seconds the oldest queued job has waited for a worker (0: none waits).",
             status.get("oldest_queued_s") or 0),
            ("animegan_job_running", "Jobs a worker is converting now.", status["running"]),
            ("animegan_job_workers",
             "Job workers that beat within ANIMEGAN_JOB_WORKER_TIMEOUT.", status["workers"]),
            ("animegan_job_frames_per_second",
             "Frames the queue's workers converted per second over the last minute.",
             status.get("frames_per_second", 0)),
        )
        for metric, documentation, value in gauges:
            family = GaugeMetricFamily(metric, documentation, labels=["queue"])
            family.add_metric([name], float(value))
            yield family
        frames = CounterMetricFamily("animegan_job_frames",
                                     "Frames converted by the queue's workers.",
                                     labels=["queue"])
        frames.add_metric([name], float(status.get("frames_total", 0)))
        yield frames
