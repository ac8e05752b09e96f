"""A bounded, timed gate in front of work that competes for the same cores (decodes,
inferences), so a burst gets 503 with a Retry-After instead of piling up threads."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Protocol

from .errors import Overloaded

#: Seconds between two looks at the queue while a piece of long work lets waiters go first.
_WAITER_POLL_S = 0.005


class QueueEvents(Protocol):
    """What the gate reports as it runs (the metrics implement it)."""

    def queue_changed(self, in_flight: int, queued: int) -> None: ...


class Gate:
    """At most ``slots`` holders and ``max_queue`` waiters, each for ``queue_timeout`` s; the
    rest get Overloaded (503), its Retry-After from the time a slot is held."""

    def __init__(self, *, slots: int = 1, max_queue: int, queue_timeout: float,
                 work: str = "converting other photos", seconds: float = 1.0,
                 events: QueueEvents | None = None) -> None:
        self.slots = slots
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.work = work
        self.events = events
        self._free = threading.Semaphore(slots)
        self._lock = threading.Lock()
        self._pending = 0
        self._running = 0
        self._seconds = seconds  # a slot's hold, smoothed

    @contextlib.contextmanager
    def slot(self, *, behind: bool = False) -> Iterator[None]:
        """Hold one slot; Overloaded when the queue is full or the wait too long. ``behind``:
        first let every waiter in (a piece of long work goes after the conversions waiting)."""
        if behind:
            self._wait_for_waiters()
        with self._lock:
            if self._pending >= self.slots + self.max_queue:
                raise Overloaded(f"the server is busy {self.work}; try again in "
                                 f"{self.retry_after()} s", self.retry_after())
            self._pending += 1
            self._report()
        try:
            if not self._free.acquire(timeout=self.queue_timeout):
                raise Overloaded(f"timed out waiting while the server was busy {self.work}; "
                                 f"try again in {self.retry_after()} s", self.retry_after())
            started = time.perf_counter()
            with self._lock:
                self._running += 1
                self._report()
            try:
                yield
            finally:
                self._free.release()
                with self._lock:
                    self._running -= 1
                    held = time.perf_counter() - started
                    self._seconds = 0.8 * self._seconds + 0.2 * held
        finally:
            with self._lock:
                self._pending -= 1
                self._report()

    def _wait_for_waiters(self) -> None:
        # a semaphore lets a releasing thread take it back before a woken waiter does
        deadline = time.monotonic() + self.queue_timeout
        while self.waiting:
            if time.monotonic() > deadline:
                raise Overloaded(f"timed out waiting while the server was busy {self.work}; "
                                 f"try again in {self.retry_after()} s", self.retry_after())
            time.sleep(_WAITER_POLL_S)

    @property
    def waiting(self) -> int:
        """Holders-to-be: in the queue, not yet in a slot."""
        with self._lock:
            return max(0, self._pending - self._running)

    def _report(self) -> None:
        if self.events is not None:
            self.events.queue_changed(self._running, max(0, self._pending - self._running))

    def retry_after(self) -> int:
        """Seconds until the queue now waiting has probably gone through."""
        return max(1, math.ceil(self._seconds * max(1, self._pending) / self.slots))

    @property
    def pending(self) -> int:
        """Holders and waiters."""
        return self._pending

    def status(self) -> dict[str, int]:
        with self._lock:
            return {"in_flight": self._running, "queued": max(0, self._pending - self._running),
                    "max_queue": self.max_queue}
