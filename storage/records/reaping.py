"""The reaper: every worker runs one; it gives jobs whose worker vanished to another worker.

One reaper per period makes the pass (the one that takes ``keys.REAPER_TURN`` for the period), so
the cost does not grow with the number of workers; if that worker dies, the turn expires and
another takes it. A job still ``running`` whose lease has expired lost its worker (SIGKILL, node gone, a pause
past the TTL): it is re-queued as the next attempt, until it has been lost
``retry.max_attempts`` times; then it fails. The script is atomic and checks state first, so
any number of reapers may run at once. It also re-publishes the message of a job whose
publish was interrupted (the outbox mark outlived ``REPUBLISH_AFTER_S``), and of a job whose
message went out but was not claimed within ``unclaimed_after_s`` (a lease TTL in workers): the
worker that took it may have died before its claim, and kombu would bring the message back only
after its visibility_timeout (hours). A job merely waiting for a busy pool is re-published too,
so each re-publish doubles the wait for the next (up to ``UNCLAIMED_REPUBLISH_MAX_S``): a long
queue gains a few duplicates, which the claim drops.

Redis outages are not worker losses. A lease also lapses when Redis itself could not be reached
(stopped, paused, restarting, restored from a backup, failing over): its holder could not renew
it. Every reaper talks to Redis each period, so every reaper of a live worker witnesses such an
outage: a call that failed with a connection error or took longer than a period, or a server
whose ``run_id`` changed since the last pass (a restart, a failover or a restore, however quick:
a lease restored from a backup lapses after it, with no failed call to see). For a lease TTL
plus a period after it reached Redis again, a reaper requeues expired leases without counting
them (by then every holder that lived through the outage has renewed, or has given its job back
itself: the delivery's release-if-still-mine, ``baton.workers.queue.claims``), and it sets ``keys.REDIS_OUTAGE`` for as long,
so that a reaper that saw nothing (a worker started meanwhile) does the same. Why the reaper's
own view and not, say, a gap in Redis's activity: a gap also appears when every worker is gone
(the crash loop ``retry.max_attempts`` exists to end), while a reaper can only witness an outage
by being alive through it. The price: a worker that dies during an outage is not counted either.
A worker cut off from Redis alone is indistinguishable from a dead one while it lasts: counted.
"""
from __future__ import annotations

import logging
from typing import Callable

import redis

from baton.storage.records import keys
from baton.storage.records.connection import text
from baton.storage.records.job_records import JobRecords, now
from baton.storage.records.pool import LUA


_log = logging.getLogger("baton.reaper")

REPUBLISH_AFTER_S = 10.0
"""A publish mark older than this means the publisher died between the state change and the publish."""
UNCLAIMED_AFTER_S = 6.0
"""A message not claimed this long after its publish may have died with the worker that took it
(workers pass their lease TTL: a worker that took it and lives claims within milliseconds)."""
UNCLAIMED_REPUBLISH_MAX_S = 900.0
"""The longest wait between two re-publishes of an unclaimed job: a message lost after a long wait in
a busy queue comes back within this."""

# KEYS: job, lease, active, outage mark. ARGV: job id, now, republish_after_s, unclaimed_after_s,
# unclaimed_republish_max_s, outage ('1': this reaper witnessed a Redis outage within the grace)
_REAP = LUA + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then redis.call('SREM', KEYS[3], ARGV[1]) return {'gone'} end
if state == 'running' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return {'alive'} end
  local worker = redis.call('HGET', KEYS[1], 'worker') or '?'
  if ARGV[6] == '1' or redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HSET', KEYS[1], 'state', 'retrying', 'updated_at', ARGV[2], 'publish_pending', ARGV[2],
               'last_event', 'lease of ' .. worker .. ' lapsed while Redis was unreachable (not counted as a loss)')
    pool_left(KEYS[1], ARGV[1])
    pool_wait(KEYS[1], ARGV[1])
    return {'outage', tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1}
  end
  local lost = redis.call('HINCRBY', KEYS[1], 'lost', 1)
  if lost >= tonumber(redis.call('HGET', KEYS[1], 'max_attempts')) then
    redis.call('HSET', KEYS[1], 'state', 'failed', 'updated_at', ARGV[2], 'finished_at', ARGV[2],
               'error', 'lost its worker ' .. lost .. ' time(s) (the last: ' .. worker .. '); retry.max_attempts reached')
    redis.call('SREM', KEYS[3], ARGV[1])
    pool_left(KEYS[1], ARGV[1])
    return {'failed'}
  end
  redis.call('HSET', KEYS[1], 'state', 'retrying', 'updated_at', ARGV[2], 'publish_pending', ARGV[2],
             'last_event', 'lease of ' .. worker .. ' expired')
  pool_left(KEYS[1], ARGV[1])
  pool_wait(KEYS[1], ARGV[1])
  return {'requeue', tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1}
end
if state == 'queued' or state == 'retrying' then
  local pending = redis.call('HGET', KEYS[1], 'publish_pending')
  if pending and tonumber(ARGV[2]) - tonumber(pending) > tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[1], 'publish_pending', ARGV[2])
    return {'republish', tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1}
  end
  local published = tonumber(redis.call('HGET', KEYS[1], 'published_at'))
  if not pending and published then
    local times = tonumber(redis.call('HGET', KEYS[1], 'republished') or '0')
    local wait = math.min(tonumber(ARGV[4]) * 2 ^ times, tonumber(ARGV[5]))
    if tonumber(ARGV[2]) - published > wait then
      redis.call('HSET', KEYS[1], 'publish_pending', ARGV[2], 'republished', times + 1)
      return {'republish', tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1}
    end
  end
  pool_wait(KEYS[1], ARGV[1])  -- (a record written before lines existed, or restored by hand, joins its line)
  return {'waiting'}
end
redis.call('SREM', KEYS[3], ARGV[1])
pool_left(KEYS[1], ARGV[1])
return {'done'}
"""

Publish = Callable[[str, int, str], None]
OnAction = Callable[[str, str], None]  # (job id, action)


_DONE_WHAT = {"requeue": "lost its worker, re-queued", "republish": "re-published",
              "outage": "its lease lapsed while Redis was unreachable: re-queued, not counted as a loss,"}


def reap_once(client: redis.Redis, publish: Publish, records: JobRecords,
              unclaimed_after_s: float = UNCLAIMED_AFTER_S, outage: bool = False) -> list[tuple[str, str]]:
    """One pass over the unfinished jobs; returns (job id, action) for each job acted on. ``outage``:
    this reaper saw Redis unreachable lately, so expired leases are not worker losses (nor are
    they while ``keys.REDIS_OUTAGE`` is set)."""
    script = client.register_script(_REAP)
    acted = []
    for job_id in map(text, client.smembers(keys.ACTIVE)):
        result = script(keys=[keys.job(job_id), keys.lease(job_id), keys.ACTIVE, keys.REDIS_OUTAGE],
                        args=[job_id, now(), REPUBLISH_AFTER_S, unclaimed_after_s, UNCLAIMED_REPUBLISH_MAX_S,
                              "1" if outage else "0"])
        action = result[0]
        if action in _DONE_WHAT:
            attempt = int(result[1])
            records.publish_marked(job_id, attempt, publish)
            _log.warning("job %s: %s as attempt %d", job_id, _DONE_WHAT[action], attempt)
        elif action == "failed":
            _log.warning("job %s: lost its worker too often; failed", job_id)
        if action not in ("alive", "waiting"):
            acted.append((job_id, action))
    return acted


def take_turn(client: redis.Redis, worker: str, period_s: float) -> bool:
    """True when this worker makes this period's pass (nobody else holds the turn)."""
    return bool(client.set(keys.REAPER_TURN, worker, nx=True, px=max(1, int(period_s * 1000 * 0.9))))
