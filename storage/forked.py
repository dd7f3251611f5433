"""Children forked from a process that has imported torch and started no thread yet (a worker's training
process as it starts, ``baton run`` once its imports are done): a checkpoint writer
(``checkpointing.writer_start``), a data-parallel attempt's ranks 1..N-1 (``workers.parallel.spare_ranks``).

Such a child starts with torch and baton's training code already imported, instead of a new interpreter
importing them for seconds of a core. A fork copies only the forking thread, so this is safe only before
any other thread starts (the callers check ``may_fork``). The child keeps none of its parent's descriptors
but the standard streams and those it is given (a copy of a training process's pipe to its worker must
not outlive the training process in it), goes by a name of its own (``/proc/PID/comm``, ``ps -o comm``:
its command line is its parent's), and leaves by ``os._exit``, running none of its parent's exit handlers.
(It lives in the storage layer, below both of its users.)
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Callable, Collection, Optional


def may_fork() -> bool:
    """Whether forking here gives a child torch for free, copies no other thread's state and no CUDA
    context (which does not survive a fork)."""
    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and torch is not None and not torch.cuda.is_initialized()


class ForkedChild:
    """A child forked by ``fork``, as much of ``subprocess.Popen`` as its users need: its pid, ``poll``,
    ``wait`` (a timeout raises ``subprocess.TimeoutExpired``), ``send_signal`` and ``kill``."""

    def __init__(self, pid: int, name: str):
        self.pid, self.name = pid, name
        self.returncode: Optional[int] = None
        self._lock = threading.Lock()

    def poll(self) -> Optional[int]:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # (reaped elsewhere)
                    self.returncode = 0
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"{self.name} {self.pid}", timeout or 0)
            time.sleep(0.01)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # (not reaped yet: the pid is still this child's)
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork(name: str, kept: Collection[int], body: Callable[[], int]) -> ForkedChild:
    """Fork a child named ``name`` that keeps the descriptors ``kept`` (and 0, 1, 2), runs ``body`` and
    exits with its status (1, its traceback on stderr, if it raises). OSError where the kernel refuses
    (no memory, too many processes or descriptors)."""
    _flush()  # (what this process had not written yet would be written twice, by the child too)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _keep_only({0, 1, 2, *kept})
            _forget_parents_helpers()
            name_process(name)
            code = body()
        except BaseException:  # noqa: BLE001 - said on stderr; the parent sees the exit status
            traceback.print_exc()
        finally:
            logging.shutdown()
            _flush()
            os._exit(code)
    return ForkedChild(pid, name)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _forget_parents_helpers() -> None:
    """multiprocessing's handles on this process's helpers (its resource tracker, its forkserver, the
    sentinel of its own parent) name descriptors the child has closed: a new interpreter has none, and
    with such a number reused by a file or socket, the job's code (a SharedMemory, a queue of a spawn
    context) would write into it. The child starts its own helpers when it needs them, as a new
    interpreter would."""
    from multiprocessing import forkserver, process, resource_tracker

    helpers = ((getattr(resource_tracker, "_resource_tracker", None), ("_fd", "_pid")),
               (getattr(forkserver, "_forkserver", None), ("_forkserver_address", "_forkserver_alive_fd",
                                                          "_forkserver_pid", "_inherited_fds")),
               (process, ("_parent_process",)))
    for holder, names in helpers:  # (private names, as of Python 3.9-3.13: those a version lacks are skipped)
        for attr in names:
            if hasattr(holder, attr):
                setattr(holder, attr, None)
    if hasattr(process, "_children"):
        setattr(process, "_children", set())


def name_process(name: str) -> None:
    """This process's name as ``/proc/PID/comm`` and ``ps -o comm`` show it (15 bytes at most)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_NAME = 15
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode()[:15])


def _keep_only(kept: set[int]) -> None:
    """Close every descriptor of this (forked) process but ``kept``."""
    for entry in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        fd = int(entry)
        if fd not in kept:
            try:
                os.close(fd)
            except OSError:
                pass
