"""One count of the web conversions, from when their body has arrived until their response
ends, so a thread stays free for ``/healthz`` and the pages (the CLI and ``convert()`` do not
count); a body still arriving is bounded by its deadline instead (web/bodies.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import Overloaded


class Admission:
    """At most ``capacity`` conversions in the app at once, counted once their upload has
    arrived, and ``capacity + spare_readers`` uploads arriving; ``retry_after`` estimates
    how long a refused client should wait (the model queue's estimate)."""

    def __init__(self, capacity: int, retry_after: Callable[[], int],
                 spare_readers: int = 0) -> None:
        self.capacity = capacity
        self.readers = capacity + spare_readers
        self._retry_after = retry_after
        self._lock = threading.Lock()
        self._admitted = 0
        self._reading = 0
        self._refused = 0

    @property
    def threads(self) -> int:
        """The most request threads its uploads and conversions hold at once."""
        return self.capacity + self.readers

    def start_reading(self) -> Ticket:
        """Let one upload arrive, or raise :class:`Overloaded` (503) before its body is read
        when the app is full or ``readers`` are arriving already; ``leave()`` when read."""
        with self._lock:
            self._refuse_if_full()
            if self._reading >= self.readers:
                self._refused += 1
                raise Overloaded(f"the server is busy receiving {self.readers} other "
                                 "uploads; try again in 1 s", 1)
            self._reading += 1
        return Ticket(self._done_reading)

    def enter(self) -> Ticket:
        """Admit one conversion whose upload has arrived, or raise :class:`Overloaded`
        (503) when ``capacity`` are in already; the ticket's ``leave()`` lets the next in."""
        with self._lock:
            self._refuse_if_full()
            self._admitted += 1
        return Ticket(self._leave)

    def _refuse_if_full(self) -> None:
        if self._admitted >= self.capacity:
            self._refused += 1
            wait = max(1, self._retry_after())
            raise Overloaded(f"the server is busy with {self.capacity} other "
                             f"conversions; try again in {wait} s", wait)

    def _leave(self) -> None:
        with self._lock:
            self._admitted -= 1

    def _done_reading(self) -> None:
        with self._lock:
            self._reading -= 1

    def status(self) -> dict[str, int]:
        """For ``/healthz``: conversions in the app now, the most at once, uploads
        arriving, refusals so far."""
        with self._lock:
            return {"admitted": self._admitted, "capacity": self.capacity,
                    "reading": self._reading, "refused": self._refused}


class Ticket:
    """One admitted conversion or arriving upload; ``leave()`` counts once, however often
    it is called."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._lock = threading.Lock()

    def leave(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()
