"""The stall watchdog: a job that makes no optimizer step for ``BATON_STALL_TIMEOUT_S``.

A stuck data loader or user code keeps the heartbeat renewing (it runs on its own thread), so
the lease alone would keep a hung job "running" forever. The loop reports every optimizer step
(``LoopControl.on_step``); when none has come for the timeout, the watchdog calls its ``on_stall``:
the job runner asks the training process for every thread's stack, kills it and every process
below it (a DataLoader worker hung in the data set's code would otherwise outlive it as an orphan),
and hands the job back as a worker loss (counted against ``retry.max_attempts``: a hang that
repeats must end). The worker goes on. Only a worker hung itself before its training process
started leaves (``exit_process``): a hung thread cannot be interrupted, so the worker's supervisor
(Kubernetes, compose, ``baton worker --gpus``) starts a fresh one.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

from baton.workers.attempt.channel import thread_stacks
from baton.workers.attempt.process_tree import kill_descendants
from baton.workers.tracking import job_logs

_log = logging.getLogger("baton.worker")

EXIT_STALLED = 70
"""Exit status of a worker that abandoned a hung job (EX_SOFTWARE): its supervisor restarts it."""
CHECK_EVERY_MAX_S = 5.0
"""The watchdog looks at most this long apart (and four times per timeout for short timeouts)."""


class StallWatchdog(threading.Thread):
    """Calls ``on_stall(idle_s, stacks)`` once when ``progress()`` has not been called for ``timeout_s``."""

    def __init__(self, job_id: str, timeout_s: float, on_stall: Callable[[float, str], None]):
        super().__init__(name=f"baton-stall-{job_id}", daemon=True)
        self.timeout_s, self._on_stall = timeout_s, on_stall
        self._last = time.monotonic()
        self._stopping = threading.Event()

    def progress(self) -> None:
        self._last = time.monotonic()

    def run(self) -> None:
        while not self._stopping.wait(min(self.timeout_s / 4, CHECK_EVERY_MAX_S)):
            idle = time.monotonic() - self._last
            if idle >= self.timeout_s:
                self._on_stall(idle, thread_stacks())
                return

    def stop(self) -> None:
        self._stopping.set()


def exit_process(why: str) -> None:
    """Leave now, whatever the hung thread is doing, and take this process's children along."""
    _log.error("exiting: %s", why)
    killed = kill_descendants()
    if killed:
        _log.error("killed the %d process(es) below this worker (DataLoader workers, the checkpoint writer, ...): %s",
                   len(killed), " ".join(map(str, sorted(killed))))
    job_logs.close_all_before_exit(why)
    logging.shutdown()
    os._exit(EXIT_STALLED)
