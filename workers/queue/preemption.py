"""A worker's shutdown: SIGTERM (a pod deletion, a spot reclaim), Ctrl-C, or its machine's preemption
notice (``spot_notice.py``), which comes before the SIGTERM.

The first of them: every job in this process checkpoints at its next optimizer-step boundary,
commits, and is released for another worker at once; then the worker exits. A watchdog makes
sure the process is gone within ``preempt_grace_s`` even if a commit hangs: it releases the jobs
(they resume from their last committed checkpoint; a late commit is fenced out) and exits.
A second SIGTERM/SIGINT does the same at once.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

from baton.schemas.errors import FencedOut
from baton.workers.tracking import job_logs

_log = logging.getLogger("baton.worker")

EXIT_RELEASED = 75
"""Exit status when the worker released its jobs without finishing them (EX_TEMPFAIL)."""


class Preemption:
    """Process-wide: whether a shutdown was asked for, and how to release what this process holds."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._releasers: dict[str, Callable[[str], None]] = {}
        self._lock = threading.Lock()
        self._signals = 0
        self.why = ""  # what asked for the shutdown first ("SIGTERM", "spot notice: ...")
        self._request_lock = threading.Lock()  # never held by the main thread outside a signal handler
        self._grace_s = 0.0
        self._on_request: Callable[[], None] = lambda: None

    def register(self, job_id: str, release: Callable[[str], None]) -> None:
        with self._lock:
            self._releasers[job_id] = release

    def unregister(self, job_id: str) -> None:
        with self._lock:
            self._releasers.pop(job_id, None)

    def install(self, grace_s: float, on_request: Callable[[], None] = lambda: None) -> None:
        """Take over SIGTERM and SIGINT in this (the worker's main) process."""
        self._grace_s, self._on_request = grace_s, on_request

        def handler(signum: int, frame) -> None:
            name = signal.Signals(signum).name
            self._signals += 1
            if self._signals == 1 and self.requested.is_set():  # the notice came first: the same shutdown goes on
                _log.warning("%s: already shutting down (%s)", name, self.why)
            elif self._signals == 1:
                self.request(name)
            else:
                threading.Thread(target=self.release_all_and_exit, args=(f"second {name}",), daemon=True).start()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def request(self, why: str) -> None:
        """Shut down as a first SIGTERM does (``why``: what asked, for the jobs' events); once. Called from
        the signal handler too: it must not take ``_lock``, which the main thread may hold when the
        signal arrives (``register``), or the handler would wait for itself."""
        with self._request_lock:
            if self.requested.is_set():
                return
            self.why = why
            self.requested.set()
        grace_s = self._grace_s
        _log.warning("%s: checkpointing at the next step, releasing jobs, exiting within %.0fs", why, grace_s)
        threading.Thread(target=self._on_request, name="baton-stop-request", daemon=True).start()
        watchdog = threading.Timer(grace_s, self.release_all_and_exit, args=(f"grace period of {grace_s:.0f}s over",))
        watchdog.daemon = True
        watchdog.start()

    def release_all_and_exit(self, why: str) -> None:
        with self._lock:
            releasers = list(self._releasers.items())
        for job_id, release in releasers:
            try:
                release(why)
            except (Exception, FencedOut) as exc:  # noqa: BLE001 - the lease will expire and the reaper requeue it
                _log.error("job %s: could not release (%s); its lease will expire instead", job_id, exc)
        _log.warning("exiting now: %s", why)
        job_logs.close_all_before_exit(why)
        logging.shutdown()
        os._exit(EXIT_RELEASED)


PREEMPTION = Preemption()
"""This process's shutdown state (a worker process runs one job at a time)."""
