"""One inference at a time per process, a bounded queue, and an honest Retry-After.

Torch already spreads one inference over every intra-op thread, so running two at
once on the same cores only adds contention. The gate therefore lets one inference
run and at most ``max_queue`` requests wait; the rest are turned away at once with a
Retry-After estimate instead of piling up threads.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Protocol

from ..errors import Overloaded


class QueueEvents(Protocol):
    """What the gate reports as it runs (the metrics implement it)."""

    def queue_changed(self, in_flight: int, queued: int) -> None: ...


class InferenceGate:
    def __init__(self, *, max_queue: int, queue_timeout: float,
                 events: QueueEvents | None = None) -> None:
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.events = events
        self._run_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._pending = 0
        self._seconds_per_inference = 1.0  # per 512 x 512 image, smoothed

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold the model for one inference; 503 when the queue is full or the wait too long."""
        with self._state_lock:
            if self._pending >= 1 + self.max_queue:
                raise Overloaded("the server is busy converting other photos; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            self._pending += 1
            self._report(running=self._run_lock.locked())
        try:
            if not self._run_lock.acquire(timeout=self.queue_timeout):
                raise Overloaded("timed out waiting for a free converter; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            try:
                with self._state_lock:
                    self._report(running=True)
                yield
            finally:
                self._run_lock.release()
        finally:
            with self._state_lock:
                self._pending -= 1
                self._report(running=self._run_lock.locked())

    def _report(self, running: bool) -> None:
        if self.events is not None:
            self.events.queue_changed(int(running), max(0, self._pending - int(running)))

    def record(self, seconds: float, pixels: int) -> None:
        """Learn the cost of an inference of ``pixels`` pixels, for Retry-After estimates."""
        per_image = seconds / max(pixels / 262_144, 0.05)
        self._seconds_per_inference = 0.8 * self._seconds_per_inference + 0.2 * per_image

    def retry_after(self) -> int:
        return max(1, math.ceil(self._seconds_per_inference * max(1, self._pending)))

    def status(self) -> dict[str, int]:
        with self._state_lock:
            in_flight = 1 if self._run_lock.locked() else 0
            pending = self._pending
        return {"in_flight": in_flight, "queued": max(0, pending - in_flight),
                "max_queue": self.max_queue}
