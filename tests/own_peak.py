"""Run a module as ``python -m`` would, then write this process's own peak RSS in bytes to
the file named by ``$OWN_PEAK_FILE``.

``python tests/own_peak.py flask --app example_app animegan convert ...``

The peak is /proc/self/status's VmHWM: the high-water mark of this process's memory since
its exec. ``ru_maxrss`` (getrusage, wait4) is no measure of a command run from a large
process: Linux carries the parent's high-water mark across fork and exec into it, so a
child of a 2 GiB pytest reports 2 GiB whatever it did.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys
from pathlib import Path


def _write_peak() -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            Path(os.environ["OWN_PEAK_FILE"]).write_text(str(int(line.split()[1]) * 1024))


if __name__ == "__main__":
    atexit.register(_write_peak)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
    runpy.run_module(module, run_name="__main__", alter_sys=True)
