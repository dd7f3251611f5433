"""Which queues live workers serve: every worker announces its queues on each reaper pass, so that a
client can tell a job waiting on a queue that no live worker serves (``baton.storage.records.job_records``);
and which workers are drained (``baton drain``: the job yields, the worker takes no other)."""
from __future__ import annotations

import redis

from baton.storage.records import keys
from baton.storage.records.connection import text

LAPSES_AFTER_PERIODS = 3
"""An announcement lapses after this many reaper periods without a new one: one late pass keeps it."""
LAPSES_AFTER_MIN_S = 5.0
"""...and never sooner than this: a worker whose passes come late on a loaded machine does not
flicker out of its queues."""


def announce(client: redis.Redis, worker: str, queues: list[str], period_s: float) -> None:
    """Say that ``worker`` serves ``queues`` for the next few reaper periods (by Redis's clock, which
    every worker and client share), and drop announcements that have lapsed."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    lapses_at = now + max(LAPSES_AFTER_PERIODS * period_s, LAPSES_AFTER_MIN_S)
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        key = keys.queue_workers(queue)
        pipe.zadd(key, {worker: lapses_at})
        pipe.zremrangebyscore(key, "-inf", now)
        pipe.expire(key, int(lapses_at - now) + 60)
    if queues:
        pipe.sadd(keys.QUEUES, *queues)
    pipe.execute()


def withdraw(client: redis.Redis, worker: str, queues: list[str]) -> None:
    """``worker`` serves its queues no more (a clean shutdown; otherwise its announcement lapses)."""
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.zrem(keys.queue_workers(queue), worker)
    pipe.execute()


def live_workers(client: redis.Redis) -> list[str]:
    """Every worker whose announcement of some queue has not lapsed."""
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    found: set[str] = set()
    for queue in client.smembers(keys.QUEUES):
        found.update(map(text, client.zrangebyscore(keys.queue_workers(text(queue)), now, "+inf")))
    return sorted(found)


def set_drained(client: redis.Redis, worker: str, drained: bool) -> bool:
    """Drain ``worker`` or undrain it; False when it already was (or was not)."""
    if drained:
        return bool(client.set(keys.worker_drained(worker), "1", nx=True))
    return bool(client.delete(keys.worker_drained(worker)))


def drained(client: redis.Redis, workers: list[str]) -> set[str]:
    """Those of ``workers`` that are drained."""
    if not workers:
        return set()
    marks = client.mget([keys.worker_drained(worker) for worker in workers])
    return {worker for worker, mark in zip(workers, marks) if mark is not None}
