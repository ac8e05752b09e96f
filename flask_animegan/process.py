"""Settings that belong to the whole process, set once, explicitly.

torch's thread pools and Python's warning filters are shared by every app in a
process, so they are not import side effects and not per-app: ``gunicorn.conf.py``
calls :func:`configure_process` in each worker before the app loads, and ``init_app``
calls it too (the first call wins; a later app asking for something else is told so
in the log, instead of silently changing the threads of the apps before it).

The process also has one side thread (:func:`side_thread`), for the few steps of a
request that split in two halves (fitting a picture in bands, a fingerprint's grids), so
that a request alone on the machine uses its second core.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from PIL import Image

from .config import available_cpus

log = logging.getLogger("flask_animegan")
_lock = threading.Lock()
_torch_threads: int | None = None
_side_lock = threading.Lock()
_side: ThreadPoolExecutor | None = None
_SIDE_NAME = "animegan-side"
_First = TypeVar("_First")
_Second = TypeVar("_Second")


def configure_process(torch_threads: int) -> int:
    """Cap torch to ``torch_threads`` intra-op threads and 1 inter-op thread, and make
    Pillow's decompression-bomb warning an error (uploads are untrusted; Pillow's own
    advice). Returns the thread count in force."""
    global _torch_threads
    with _lock:
        if _torch_threads is not None:
            if torch_threads != _torch_threads:
                log.warning("flask_animegan: torch threads are per process and already set "
                            "to %d; ignoring a request for %d (set ANIMEGAN_TORCH_THREADS "
                            "the same for every app in a process)", _torch_threads, torch_threads)
            return _torch_threads
        import torch

        torch.set_num_threads(torch_threads)
        with contextlib.suppress(RuntimeError):  # only settable before inter-op work starts
            torch.set_num_interop_threads(1)
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        _torch_threads = torch_threads
        return torch_threads


def configure_decoding() -> None:
    """The part of :func:`configure_process` the decode helper processes need (no torch)."""
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def side_thread() -> ThreadPoolExecutor | None:
    """The process's side thread, to run one half of a split step while the caller runs
    the other; None where the process may use one CPU only (the halves then run one
    after the other: the result is the same), and on the side thread itself (a half
    waiting there for its own half would wait forever)."""
    global _side
    if available_cpus() < 2 or threading.current_thread().name.startswith(_SIDE_NAME):
        return None
    with _side_lock:
        if _side is None:
            _side = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_SIDE_NAME)
        return _side


def in_halves(first: Callable[[], _First],
              second: Callable[[], _Second]) -> tuple[_First, _Second]:
    """``first()`` in this thread and ``second()`` on the side thread at once, or one
    after the other where there is no side thread: both results."""
    side = side_thread()
    if side is None:
        return first(), second()
    later = side.submit(second)
    return first(), later.result()


def _forget_side_thread() -> None:
    """In a forked child (a gunicorn worker, an RQ work horse), which has none of its
    parent's threads: the next split step starts its own."""
    global _side, _side_lock
    _side, _side_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_side_thread)


def start_side_thread() -> None:
    """Start the side thread now and let it allocate once (its malloc arena): a helper
    process calls this before it limits its address space, so that a decode under the
    limit never has to find room for a thread."""
    side = side_thread()
    if side is not None:
        side.submit(lambda: Image.new("RGB", (64, 64)).resize((32, 32))).result()
