"""The heartbeat that keeps a worker's hold on a job: it renews the lease every ``heartbeat_s``, writes
the progress offered since the last renewal (``offer``) in the same script, and brings back the job's
cancel flag, the worker's stopping flag and the scheduler's request to yield;
when the lease is gone, or cannot be renewed for a whole TTL, the attempt is fenced out and must stop
(``baton.storage.records.leases`` holds the scripts)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import redis

from baton.storage.records.leases import Renewer
from baton.workers.queue.redis_retry import TRANSIENT_REDIS_ERRORS

_log = logging.getLogger("baton.worker")


class Heartbeat(threading.Thread):
    """Renews the lease in the background; the loop reads its flags between steps."""

    def __init__(self, client: redis.Redis, job_id: str, lease_token: str, worker: str, ttl_s: float, every_s: float,
                 on_renew: Callable[[], None] = lambda: None):
        super().__init__(name=f"baton-heartbeat-{job_id}", daemon=True)
        self._renew = Renewer(client, job_id, worker)
        self._token, self._ttl_ms, self._every_s, self._ttl_s = lease_token, int(ttl_s * 1000), every_s, ttl_s
        self._stopping = threading.Event()  # not _stop: that is Thread's own method, which a fork calls
        self.fenced = threading.Event()
        self.cancel_requested = threading.Event()
        self.worker_stopping = threading.Event()
        self.yield_requested = ""  # why the scheduler asked this job to yield its worker (set once)
        self.unreachable = threading.Event()  # a renewal failed, or Redis took longer than a period to answer
        self._on_renew = on_renew
        self._lock = threading.Lock()  # a renewal and a change of token never overlap
        self._pending: dict[str, object] = {}  # record fields offered since the last renewal that carried them
        self._pending_lock = threading.Lock()
        self._confirmed_at = time.monotonic()  # the claim that set the lease was sent before this

    @property
    def token(self) -> str:
        return self._token

    def swap_token(self, change: Callable[[], bool], new_token: str) -> bool:
        """Run ``change`` (the script that moves the lease to ``new_token``) between two renewals;
        renew ``new_token`` from then on if it returned True."""
        with self._lock:
            if not change():
                return False
            self._token = new_token
            return True

    def offer(self, fields: dict[str, object]) -> None:
        """Fields for the job's record (progress, the latest commit): the next renewal writes them, the
        newest value of each, fenced by the lease."""
        with self._pending_lock:
            self._pending.update(fields)

    def take_pending(self) -> dict[str, object]:
        """The fields offered and not yet written (and forget them)."""
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        return pending

    def write_pending(self, write: Callable[[dict[str, object]], object]) -> None:
        """``write`` the fields offered and not yet written, now, between two renewals: a renewal carrying
        older values cannot land after it."""
        with self._lock:
            fields = self.take_pending()
            if fields:
                write(fields)

    def _give_back(self, fields: dict[str, object]) -> None:
        with self._pending_lock:
            self._pending = {**fields, **self._pending}  # newer offers win

    def valid_until(self) -> float:
        """time.monotonic() past which the lease may have expired: the last renewal that succeeded
        was *sent* at ``_confirmed_at``, so Redis set its expiry no earlier than that plus the TTL."""
        return self._confirmed_at + self._ttl_s

    def run(self) -> None:
        while not self._stopping.wait(self._every_s):
            sent = time.monotonic()
            try:
                with self._lock:
                    fields = self.take_pending()
                    try:
                        renewal = self._renew(self._token, self._ttl_ms,
                                              {**fields, "updated_at": time.time()} if fields else None)
                    except redis.RedisError:
                        self._give_back(fields)  # (inside the lock: a flush cannot come between)
                        raise
            except redis.RedisError as exc:
                if isinstance(exc, TRANSIENT_REDIS_ERRORS):
                    self.unreachable.set()
                if time.monotonic() >= self.valid_until():  # cannot prove the lease is still ours
                    _log.warning("lease %s: no renewal for %.0fs (%s): fencing this attempt out", self._token,
                                 self._ttl_s, exc)
                    self.fenced.set()
                    return
                _log.warning("lease %s: renewal failed (%s); the lease holds for %.1fs more", self._token, exc,
                             self.valid_until() - time.monotonic())
                continue
            if time.monotonic() - sent > self._every_s:  # Redis held the renewal back (paused, overloaded)
                self.unreachable.set()
            if not renewal.held:
                _log.warning("lease %s %s: fencing this one out", self._token,
                             "lapsed while Redis was unreachable" if self.unreachable.is_set()
                             else "is gone: another attempt owns the job")
                self.fenced.set()
                return
            self._confirmed_at = sent
            self._on_renew()
            if renewal.cancel_requested:
                self.cancel_requested.set()
            if renewal.worker_stopping:
                self.worker_stopping.set()
            if renewal.yield_requested and not self.yield_requested:
                self.yield_requested = renewal.yield_requested

    def stop(self) -> None:
        self._stopping.set()
