"""One count of the web conversions, from when their body has arrived until their response
ends, so a thread stays free for ``/healthz`` and the pages (the CLI and ``convert()`` do not
count); a body still arriving is bounded by its deadline instead (web/bodies.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import Overloaded


class Admission:
    """At most ``capacity`` conversions in the app at once; ``retry_after`` estimates
    how long a refused client should wait (the model queue's estimate)."""

    def __init__(self, capacity: int, retry_after: Callable[[], int]) -> None:
        self.capacity = capacity
        self._retry_after = retry_after
        self._lock = threading.Lock()
        self._admitted = 0
        self._refused = 0

    def check(self) -> None:
        """Raise :class:`Overloaded` (503) when ``capacity`` are in already: a full app
        refuses an upload before reading it, without taking a place for it."""
        with self._lock:
            self._refuse_if_full()

    def enter(self) -> Ticket:
        """Admit one conversion, or raise :class:`Overloaded` (503) when ``capacity``
        are in already; the ticket's ``leave()`` lets the next one in."""
        with self._lock:
            self._refuse_if_full()
            self._admitted += 1
        return Ticket(self)

    def _refuse_if_full(self) -> None:
        if self._admitted >= self.capacity:
            self._refused += 1
            wait = max(1, self._retry_after())
            raise Overloaded(f"the server is busy with {self.capacity} other "
                             f"conversions; try again in {wait} s", wait)

    def _leave(self) -> None:
        with self._lock:
            self._admitted -= 1

    def status(self) -> dict[str, int]:
        """For ``/healthz``: conversions in the app now, the most at once, refusals so far."""
        with self._lock:
            return {"admitted": self._admitted, "capacity": self.capacity,
                    "refused": self._refused}


class Ticket:
    """One admitted conversion; ``leave()`` counts once, however often it is called."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission
        self._lock = threading.Lock()

    def leave(self) -> None:
        with self._lock:
            admission, self._admission = self._admission, None
        if admission is not None:
            admission._leave()
