"""The reaper: every worker runs one; each period one of them makes the pass (``baton.storage.records.reaping``
holds the pass, its script and the reasons) and the scheduler's turn (``baton.storage.records.scheduling``:
which running jobs yield to waiting ones), and every reaper witnesses Redis outages, after which
expired leases are not counted as worker losses. A reaper that does not hold the turn costs Redis one
command a period (its try), and its worker's announcement (``presence``) one script every few periods."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import redis
from kombu.exceptions import KombuError

from baton.storage.records import keys
from baton.storage.records.job_records import JobRecords
from baton.storage.records import presence
from baton.storage.records.reaping import (UNCLAIMED_AFTER_S, OnAction, Publish, reap_due, reap_once, redis_restarted,
                                           sweep_due, take_turn)
from baton.storage.records.scheduling import Scheduler, Yield
from baton.workers.queue import search_steps
from baton.workers.queue.redis_retry import TRANSIENT_REDIS_ERRORS

_log = logging.getLogger("baton.reaper")


class Reaper(threading.Thread):
    """``lease_ttl_s`` (the workers' lease TTL) sets how long after a Redis outage this reaper counts
    no expired lease as a loss, and how long a message may wait for its claim."""

    def __init__(self, client: redis.Redis, publish: Publish, period_s: float, worker: str,
                 on_action: OnAction = lambda job_id, action: None, lease_ttl_s: float = UNCLAIMED_AFTER_S,
                 every_pass: Callable[[], None] = lambda: None,
                 on_turn: Callable[[Optional[dict[str, tuple[int, int]]], list[Yield]], None] = lambda counts, yields: None):
        super().__init__(name="baton-reaper", daemon=True)
        self._client, self._publish, self._period_s, self._on_action = client, publish, period_s, on_action
        self._every_pass = every_pass  # the worker's other periodic duty: announcing the queues it serves
        self._announce_every_s = presence.announce_every_s(period_s)  # (so often, not every pass)
        self._announced_at = time.monotonic()  # (the worker announced itself as it started)
        self._on_turn = on_turn  # each pass: the queues' (waiting, running) when this worker made the turn, else None
        self._worker, self._lease_ttl_s = worker, lease_ttl_s
        self._records = JobRecords(client)
        self._scheduler = Scheduler(client)
        self._stopping = threading.Event()
        self._unreachable = False  # since the last call that reached Redis
        self._held = False  # this reaper held the turn at its last pass
        self._grace_until = 0.0  # time.monotonic() until which expired leases are blamed on Redis

    @property
    def grace_s(self) -> float:
        return self._lease_ttl_s + self._period_s

    def run(self) -> None:
        while not self._stopping.wait(self._period_s):
            try:
                self.make_pass()
            except TRANSIENT_REDIS_ERRORS as exc:  # Redis away: the next pass tries again, with grace
                self._unreachable = True
                _log.warning("reaper: Redis unreachable (%s: %s)", type(exc).__name__, exc)
            except (redis.RedisError, KombuError, OSError) as exc:
                _log.warning("reaper: %s", exc)
            except Exception:  # noqa: BLE001 - one bad record must not end reaping and scheduling for the pool
                _log.exception("reaper: a pass failed; the next one tries again")

    def make_pass(self) -> None:
        started = time.monotonic()
        turn = self._held = take_turn(self._client, self._worker, self._period_s, self._held)
        if started - self._announced_at >= self._announce_every_s or self._unreachable:
            self._every_pass()
            self._announced_at = started
        restarted = turn and redis_restarted(self._client, self.grace_s)
        if self._unreachable or restarted or time.monotonic() - started > self._period_s:  # an outage ended
            self._unreachable = False
            self._grace_until = time.monotonic() + self.grace_s
            self._client.set(keys.REDIS_OUTAGE, self._worker, px=int(self.grace_s * 1000))
            _log.warning("reaper: Redis is back after an outage: for %.0fs expired leases are not worker losses",
                         self.grace_s)
        if not turn:
            self._on_turn(None, [])
            return
        outage = time.monotonic() < self._grace_until
        acted = reap_due(self._client, self._publish, self._records, self._lease_ttl_s, outage)
        if sweep_due(self._client, self._worker):
            acted += reap_once(self._client, self._publish, self._records, self._lease_ttl_s, outage)
            presence.prune(self._client)
            search_steps.advance_running(self._client, self._publish)
        for job_id, action in acted:
            self._on_action(job_id, action)
        yields = self._scheduler.turn()
        pool = self._scheduler.pool
        self._on_turn({queue: pool.counts(queue) for queue in pool.queues()}, yields)

    def stop(self) -> None:
        self._stopping.set()
