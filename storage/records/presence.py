"""Which queues live workers serve: every worker announces its queues on each reaper pass, so that a
client can tell a job waiting on a queue that no live worker serves (``baton.storage.records.job_records``)."""
from __future__ import annotations

import redis

from baton.storage.records import keys

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
