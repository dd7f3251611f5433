"""The reaper: every worker runs one; it gives jobs whose worker vanished to another worker.

One reaper makes the passes, the one that holds ``keys.REAPER_TURN`` (it keeps it each period), so
the cost does not grow with the number of workers; if that worker dies, the turn lapses within two
periods and another takes it (every reaper tries each period: one command). A job still ``running`` whose lease has expired lost its worker (SIGKILL, node gone, a pause
past the TTL): it is re-queued as the next attempt, until it has been lost
``retry.max_attempts`` times; then it fails. One whose cancel was asked for ends ``cancelled`` instead,
at once, with its last committed checkpoint (its worker could not stop it: nothing trains it again). The scripts are atomic and check state first, so
any number of reapers may run at once.

Nor does a period's pass grow with the number of jobs: every claim and renewal scores the job in
``keys.LEASES_DUE`` by its lease's expiry (Redis's clock), and each period looks only at the jobs past
it (``reap_due``: one script). Every ``SWEEP_EVERY_S`` the pass also goes over every unfinished job
(``reap_once``, ``SWEEP_CHUNK`` jobs a script): the waits below, and anything the index missed. It also re-publishes the message of a job whose
publish was interrupted (the outbox mark outlived ``REPUBLISH_AFTER_S``), and of a job whose
message went out but was not claimed within ``unclaimed_after_s`` (a lease TTL in workers): the
worker that took it may have died before its claim, and kombu would bring the message back only
after its visibility_timeout (hours). A job merely waiting for a busy pool is re-published too,
so each re-publish doubles the wait for the next (up to ``UNCLAIMED_REPUBLISH_MAX_S``): a long
queue gains a few duplicates, which the claim drops.

Redis outages are not worker losses. A lease also lapses when Redis itself could not be reached
(stopped, paused, restarting, restored from a backup, failing over): its holder could not renew
it. Every reaper talks to Redis each period (its try for the turn, one command), so every reaper of a
live worker witnesses such an outage: a call that failed with a connection error or took longer than a
period; and the reaper that holds the turn also sees a server whose ``run_id`` is not the one the last
turn saw (``keys.REDIS_RUN_ID``: a restart, a failover or a restore, however quick: a lease restored
from a backup lapses after it, with no failed call to see). For a lease TTL
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

# The pass over one job, a Lua function (``reap_job``) that the two scripts below call: id, now (s, the
# clients' clock, which publish marks use), republish_after_s, unclaimed_after_s, unclaimed_republish_max_s,
# outage ('1': this reaper witnessed a Redis outage within the grace), Redis's time in ms (the due index's clock).
_REAP_JOB = LUA + """
local function reap_job(id, now, republish_after, unclaimed_after, republish_max, outage, tnow)
  local job = '@J' .. id
  local lease = job .. ':lease'
  local state = redis.call('HGET', job, 'state')
  if state ~= 'running' then redis.call('ZREM', '@D', id) end
  if not state then redis.call('SREM', '@A', id) return {'gone'} end
  if state == 'running' then
    if ARGV[6] == 'sweep' then  -- a lease the index holds as unexpired is left to it (reap_due)
      local due = redis.call('ZSCORE', '@D', id)
      if due and tonumber(due) > tnow then return {'alive'} end
    end
    local ttl = redis.call('PTTL', lease)
    if ttl ~= -2 then  -- alive (-1: a lease without expiry, set by hand: looked at again in a second)
      redis.call('ZADD', '@D', tnow + (ttl > 0 and ttl or 1000), id)
      return {'alive'}
    end
    redis.call('ZREM', '@D', id)
    local worker = redis.call('HGET', job, 'worker') or '?'
    if redis.call('HEXISTS', job, 'cancel_requested') == 1 then  -- its worker never stopped it: it ends here
      if outage == '1' or redis.call('EXISTS', '@O') == 1 then
        job_event(job, now, 'lapsed', 'lease of ' .. worker .. ' lapsed while Redis was unreachable')
        cancel_if_asked(job, id, now, 'stopped (its lease lapsed while Redis was unreachable)')
      else
        job_event(job, now, 'lost', 'lease of ' .. worker .. ' expired')
        cancel_if_asked(job, id, now, 'lost its worker (lease of ' .. worker .. ' expired)')
      end
      return {'cancelled'}
    end
    local function requeue(word, event)  -- back to its line, its next attempt marked for publishing
      redis.call('HSET', job, 'state', 'retrying', 'updated_at', now, 'publish_pending', now, 'last_event', event)
      job_event(job, now, word == 'outage' and 'lapsed' or 'lost', event)
      pool_left(job, id)
      pool_wait(job, id)
      return {word, tonumber(redis.call('HGET', job, 'attempt')) + 1}
    end
    if outage == '1' or redis.call('EXISTS', '@O') == 1 then
      return requeue('outage', 'lease of ' .. worker .. ' lapsed while Redis was unreachable (not counted as a loss)')
    end
    local lost = redis.call('HINCRBY', job, 'lost', 1)
    if lost >= tonumber(redis.call('HGET', job, 'max_attempts')) then
      redis.call('HSET', job, 'state', 'failed', 'updated_at', now, 'finished_at', now,
                 'error', 'lost its worker ' .. lost .. ' time(s) (the last: ' .. worker .. '); retry.max_attempts reached')
      redis.call('SREM', '@A', id)
      job_event(job, now, 'lost', 'lease of ' .. worker .. ' expired')
      job_event(job, now, 'failed', 'retry.max_attempts reached')
      redis.call('DEL', job .. ':live')
      pool_left(job, id)
      return {'failed'}
    end
    return requeue('requeue', 'lease of ' .. worker .. ' expired')
  end
  if state == 'queued' or state == 'retrying' then
    local pending = redis.call('HGET', job, 'publish_pending')
    if pending and tonumber(now) - tonumber(pending) > tonumber(republish_after) then
      redis.call('HSET', job, 'publish_pending', now)
      return {'republish', tonumber(redis.call('HGET', job, 'attempt')) + 1}
    end
    local published = tonumber(redis.call('HGET', job, 'published_at'))
    if not pending and published then
      local times = tonumber(redis.call('HGET', job, 'republished') or '0')
      local wait = math.min(tonumber(unclaimed_after) * 2 ^ times, tonumber(republish_max))
      if tonumber(now) - published > wait then
        redis.call('HSET', job, 'publish_pending', now, 'republished', times + 1)
        return {'republish', tonumber(redis.call('HGET', job, 'attempt')) + 1}
      end
    end
    pool_wait(job, id)  -- (a record written before lines existed, or restored by hand, joins its line)
    return {'waiting'}
  end
  redis.call('SREM', '@A', id)
  pool_left(job, id)
  return {'done'}
end
local function redis_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function reap_each(ids, tnow)
  local acted = {}
  for _, id in ipairs(ids) do
    local r = reap_job(id, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tnow)
    if r[1] ~= 'alive' and r[1] ~= 'waiting' then table.insert(acted, {id, r[1], r[2] or 0}) end
  end
  return acted
end
""".replace("@J", keys.job("")).replace("@A", keys.ACTIVE).replace("@O", keys.REDIS_OUTAGE).replace(
    "@D", keys.LEASES_DUE)

# ARGV: now, republish_after_s, unclaimed_after_s, unclaimed_republish_max_s, outage, 'sweep', job ids...
# -> {job id, action, next attempt} for each job acted on (not those alive or waiting). A running job
# the due index holds is left to it (``reap_due``).
_REAP_MANY = _REAP_JOB + """
return reap_each({unpack(ARGV, 7)}, redis_ms())
"""

# ARGV: as _REAP_MANY's first five, then the most jobs to look at. The running jobs whose lease is past
# its expiry by the due index (every claim and renewal moves it), oldest first.
_REAP_DUE = _REAP_JOB + """
local tnow = redis_ms()
return reap_each(redis.call('ZRANGEBYSCORE', '@D', '-inf', tnow, 'LIMIT', 0, tonumber(ARGV[6])), tnow)
""".replace("@D", keys.LEASES_DUE)

SWEEP_EVERY_S = 5.0
"""How often the reaper goes over every unfinished job (re-publishes, records left behind); the leases
that lapse are found every period from the due index, without a look at the others."""
SWEEP_CHUNK = 200
"""Jobs per script in a sweep: each call holds Redis for a fraction of a millisecond."""
DUE_LIMIT = 1000
"""The most lapsed leases one period acts on (the rest in the next)."""


Publish = Callable[[str, int, str], None]
OnAction = Callable[[str, str], None]  # (job id, action)


_DONE_WHAT = {"requeue": "lost its worker, re-queued", "republish": "re-published",
              "outage": "its lease lapsed while Redis was unreachable: re-queued, not counted as a loss,"}


def reap_once(client: redis.Redis, publish: Publish, records: JobRecords,
              unclaimed_after_s: float = UNCLAIMED_AFTER_S, outage: bool = False) -> list[tuple[str, str]]:
    """One pass over every unfinished job (``keys.ACTIVE``, in chunks of ``SWEEP_CHUNK`` per script);
    returns (job id, action) for each job acted on. ``outage``: this reaper saw Redis unreachable
    lately, so expired leases are not worker losses (nor are they while ``keys.REDIS_OUTAGE`` is set)."""
    script = client.register_script(_REAP_MANY)
    ids = sorted(map(text, client.smembers(keys.ACTIVE)))
    acted = []
    for start in range(0, len(ids), SWEEP_CHUNK):
        found = script(args=[*_reap_args(unclaimed_after_s, outage), "sweep", *ids[start:start + SWEEP_CHUNK]])
        acted += _acted_on(found, records, publish)
    return acted


def reap_due(client: redis.Redis, publish: Publish, records: JobRecords,
             unclaimed_after_s: float = UNCLAIMED_AFTER_S, outage: bool = False) -> list[tuple[str, str]]:
    """``reap_once`` for the running jobs whose lease is past its expiry by the due index: one script,
    whatever the number of jobs."""
    found = client.register_script(_REAP_DUE)(args=[*_reap_args(unclaimed_after_s, outage), DUE_LIMIT])
    return _acted_on(found, records, publish)


def sweep_due(client: redis.Redis, worker: str) -> bool:
    """True when a full pass over the unfinished jobs is due (at most one every ``SWEEP_EVERY_S``)."""
    return bool(client.set(keys.REAPER_SWEPT, worker, nx=True, px=int(SWEEP_EVERY_S * 1000)))


def _reap_args(unclaimed_after_s: float, outage: bool) -> list:
    return [now(), REPUBLISH_AFTER_S, unclaimed_after_s, UNCLAIMED_REPUBLISH_MAX_S, "1" if outage else "0"]


def _acted_on(found: list, records: JobRecords, publish: Publish) -> list[tuple[str, str]]:
    acted = []
    for raw_id, raw_action, attempt in found:
        job_id, action = text(raw_id), text(raw_action)
        if action in _DONE_WHAT:
            records.publish_marked(job_id, int(attempt), publish)
            _log.warning("job %s: %s as attempt %d", job_id, _DONE_WHAT[action], int(attempt))
        elif action == "failed":
            _log.warning("job %s: lost its worker too often; failed", job_id)
        elif action == "cancelled":
            _log.warning("job %s: lost its worker after a cancel was asked for; cancelled", job_id)
        acted.append((job_id, action))
    return acted


def redis_restarted(client: redis.Redis, grace_s: float) -> bool:
    """By the reaper that holds the turn: True when the server's ``run_id`` is not the one the last turn
    saw (a restart, a failover, a restore from a backup), or none was seen and the server started within
    ``grace_s`` (a restart that lost the keys too)."""
    info = client.info("server")
    seen = client.set(keys.REDIS_RUN_ID, info["run_id"], get=True)
    return text(seen) != info["run_id"] if seen is not None else float(info["uptime_in_seconds"]) < grace_s


# KEYS: the turn. ARGV: worker, ms it is held. 1 when this worker held it and keeps it, else 0.
_KEEP_TURN = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

TURN_HELD_PERIODS = 2
"""The turn lapses this many periods after its holder last kept it: then another reaper takes it."""


def take_turn(client: redis.Redis, worker: str, period_s: float, held: bool = False) -> bool:
    """True when ``worker`` makes this period's pass: it held the turn (``held``) and keeps it, or the
    turn was free and it takes it (one command: every reaper tries every period)."""
    ms = max(1, int(period_s * 1000 * TURN_HELD_PERIODS))
    if held and client.register_script(_KEEP_TURN)(keys=[keys.REAPER_TURN], args=[worker, ms]):
        return True
    return bool(client.set(keys.REAPER_TURN, worker, nx=True, px=ms))
