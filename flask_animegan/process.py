"""Settings that belong to the whole process (torch's threads, warning filters), set once
by ``gunicorn.conf.py`` and ``init_app``: the first call wins."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings

from PIL import Image

log = logging.getLogger("flask_animegan")
_lock = threading.Lock()
_torch_threads: int | None = None


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
    """The part of :func:`configure_process` the helper process needs (no torch)."""
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def process_alive(pid: int | None) -> bool:
    """Whether a process ``pid`` runs on this host (another user's counts; a zombie too)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
