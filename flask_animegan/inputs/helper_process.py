"""Helper processes that handle untrusted files under time and memory limits: both ends.

The caller's side is :class:`HelperProcess` (``python -m MODULE`` with capped thread
pools, one request at a time, answers read by a deadline, its CPU time, a kill) and
:class:`HelperPool` (idle helpers of this process, reused). The helper's side is
:func:`serve`, the loop a helper module's ``main`` runs, with :func:`write_answer` and
:func:`address_space_limit`. :mod:`.helper` (photos, through :mod:`.isolation`) and
:mod:`.frames_helper` (animations and videos) are the two helpers; they differ only in
the module run and how a request is answered.

The wire format, both ways: ``>II`` (JSON header length, payload length), the JSON
header, then the payload (a request's file; an answer's pixels or track).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..process import configure_decoding, start_side_thread

FRAME = struct.Struct(">II")
#: A request that runs past its timeout having had less than this share of it in CPU
#: time was starved by the load (503, try again), not slow by itself (413, another file).
STARVED_SHARE = 0.5
#: The size asked for each pipe to and from a helper (Linux's default most: 1 MiB).
PIPE_BYTES = 1 << 20


def read_exact(stream: BinaryIO, count: int) -> bytes | None:
    """``count`` bytes from ``stream``, or None at end of file."""
    chunks, remaining = [], count
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


# -- the caller's side -------------------------------------------------------------------
class HelperProcess:
    """One helper process running ``python -m module``, owned by the process that
    started it (a copy inherited across a fork is never used nor killed by the child)."""

    def __init__(self, module: str) -> None:
        package_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_parent,
                                                          env.get("PYTHONPATH"))))
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        self.module = module
        self.owner = os.getpid()
        self.process = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, bufsize=0)
        for stream in (self.process.stdin, self.process.stdout):
            # an upload or an answer (a photo's 786 KB of samples) in one go, not in 64 KiB
            # turns of the two processes; Linux only, and the default size still works
            with contextlib.suppress(AttributeError, OSError):
                fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]

    def send(self, header: dict[str, Any], data: bytes) -> None:
        head = json.dumps(header).encode()
        stdin = self.process.stdin
        assert stdin is not None  # stdin=PIPE
        stdin.write(FRAME.pack(len(head), len(data)) + head)
        stdin.write(data)

    def receive(self, deadline: float) -> tuple[dict[str, Any], bytes]:
        """One answer, by ``deadline`` (monotonic) or TimeoutError; EOFError if it exited."""
        head_len, payload_len = FRAME.unpack(self._read(FRAME.size, deadline))
        answer = json.loads(self._read(head_len, deadline))
        return answer, self._read(payload_len, deadline)

    def request(self, header: dict[str, Any], data: bytes,
                timeout: float) -> tuple[dict[str, Any], bytes]:
        """Send one request and wait at most ``timeout`` s for its answer."""
        self.send(header, data)
        return self.receive(time.monotonic() + timeout)

    def _read(self, count: int, deadline: float) -> bytes:
        assert self.process.stdout is not None  # stdout=PIPE
        fd = self.process.stdout.fileno()
        chunks, remaining = [], count
        while remaining:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                raise EOFError(f"the helper {self.module} exited")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def cpu_seconds(self) -> float | None:
        """The CPU time the helper has used so far (None where /proc cannot say)."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

    def starved(self, cpu_before: float | None, waited: float) -> bool:
        """Whether a request that timed out after ``waited`` s hardly ran (less than
        :data:`STARVED_SHARE` of it in CPU since ``cpu_before``): the load's fault, not
        the file's. Call it before killing the helper."""
        cpu_after = self.cpu_seconds()
        return (cpu_before is not None and cpu_after is not None
                and cpu_after - cpu_before < STARVED_SHARE * waited)

    def died_of_a_crash(self) -> bool:
        """Whether the helper ended by a signal other than a kill (the kernel's OOM
        killer sends SIGKILL; a decoder that crashes, SIGSEGV or SIGABRT)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(1)
        code = self.process.returncode
        return code is not None and code < 0 and -code != signal.SIGKILL

    def kill(self) -> None:
        if self.owner != os.getpid():
            return  # inherited across a fork: the parent's, not ours to kill
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(5)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class HelperPool:
    """Idle helpers of one module in this process, started on demand and reused."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._idle: list[HelperProcess] = []
        self._lock = threading.Lock()
        self.started = 0
        self.killed = 0

    def take(self) -> HelperProcess:
        with self._lock:
            while self._idle:
                helper = self._idle.pop()
                if helper.owner == os.getpid() and helper.process.poll() is None:
                    return helper
            self.started += 1
        return HelperProcess(self.module)

    def give_back(self, helper: HelperProcess) -> None:
        with self._lock:
            self._idle.append(helper)

    def discard(self, helper: HelperProcess) -> None:
        with self._lock:
            self.killed += 1
        helper.kill()

    def prestart(self, count: int) -> None:
        """Start helpers now (at app startup) so the first requests do not wait for them."""
        with self._lock:
            # helpers inherited across a fork are the parent's: they do not count
            self._idle = [h for h in self._idle if h.owner == os.getpid()]
            missing = max(0, count - len(self._idle))
            self.started += missing
        helpers = [HelperProcess(self.module) for _ in range(missing)]
        with self._lock:
            self._idle.extend(helpers)

    def close(self) -> None:
        with self._lock:
            helpers, self._idle = self._idle, []
        for helper in helpers:
            helper.kill()


# -- the helper's side -------------------------------------------------------------------
def write_answer(out: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    head = json.dumps(header).encode()
    out.write(FRAME.pack(len(head), len(payload)) + head)
    out.write(payload)
    out.flush()


def _address_space() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


@contextlib.contextmanager
def address_space_limit(memory: int) -> Iterator[None]:
    """RLIMIT_AS at ``memory`` bytes above what this process holds now (never above the
    hard limit), restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space() + int(memory)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def serve(answer: Callable[[BinaryIO, dict[str, Any], bytes], None], *,
          niceness: int = 0) -> None:
    """A helper's main loop: read requests from stdin until it closes, and have
    ``answer(out, request, data)`` write each one's answers (:func:`write_answer`)."""
    if niceness:
        os.nice(niceness)
    configure_decoding()
    start_side_thread()  # before any decode's address-space limit
    # Answers go to the original stdout; anything a library prints goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin = sys.stdin.buffer
    while True:
        frame = read_exact(stdin, FRAME.size)
        if frame is None:
            return
        head_len, data_len = FRAME.unpack(frame)
        head = read_exact(stdin, head_len)
        data = read_exact(stdin, data_len)
        if head is None or data is None:
            return
        try:
            answer(out, json.loads(head), data)
        except BrokenPipeError:
            # the caller stopped reading (it closed the stream or was killed): nothing is
            # left to answer, and no traceback for its log (nor a flush at exit) is wanted
            os._exit(0)
