"""Pausing a job at a validation and continuing it: a search's rungs.

A job whose record holds ``pause_at`` stops at the first validation at or past that step, that
validation's checkpoint committed, and its worker records it ``paused``: it leaves the pool (no slot,
no place in a line, nothing for the reaper) and waits for someone to continue it. ``continue_job``
queues it again as its next attempt, with the next step to pause at (None: to its end); the attempt
resumes from the paused checkpoint, so the weights are those of a run never paused.
"""
from __future__ import annotations

from typing import Optional

import redis

from baton.storage.records import keys
from baton.storage.records.job_records import now
from baton.storage.records.pool import LUA

# KEYS: job, lease, active. ARGV: lease token, now, reason, job id. 1, 0 if fenced out, or -2 when a
# cancel was asked for meanwhile (the job stopped at a checkpoint: it ends cancelled).
_PAUSE = LUA + """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
pool_left(KEYS[1], ARGV[4])
redis.call('SREM', KEYS[3], ARGV[4])
if redis.call('HGET', KEYS[1], 'cancel_requested') then
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'updated_at', ARGV[2], 'finished_at', ARGV[2],
             'last_event', 'cancelled as it paused (' .. ARGV[3] .. ')')
  job_event(KEYS[1], ARGV[2], 'cancelled', 'cancelled as it paused (' .. ARGV[3] .. ')')
  redis.call('DEL', KEYS[1] .. ':live')
  redis.call('HDEL', KEYS[1], 'cancel_requested')
  return -2
end
redis.call('HSET', KEYS[1], 'state', 'paused', 'updated_at', ARGV[2], 'last_event', ARGV[3])
job_event(KEYS[1], ARGV[2], 'paused', ARGV[3])
return 1
"""

# KEYS: job, active. ARGV: job id, now, pause_at ('' for none), why, the pause_at it must have paused at ('': any).
# The next attempt, or -1 when not paused (there).
_CONTINUE = LUA + """
if redis.call('HGET', KEYS[1], 'state') ~= 'paused' then return -1 end
if ARGV[5] ~= '' and redis.call('HGET', KEYS[1], 'pause_at') ~= ARGV[5] then return -1 end
redis.call('HSET', KEYS[1], 'state', 'retrying', 'updated_at', ARGV[2], 'publish_pending', ARGV[2],
           'last_event', ARGV[4])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], 'pause_at') else redis.call('HSET', KEYS[1], 'pause_at', ARGV[3]) end
job_event(KEYS[1], ARGV[2], 'continued', ARGV[4], '')
redis.call('SADD', KEYS[2], ARGV[1])
pool_wait(KEYS[1], ARGV[1])
return tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1
"""


def pause(client: redis.Redis, job_id: str, token: str, reason: str) -> int:
    """The attempt holding ``token`` paused the job: 1, 0 if that lease no longer holds it, -2 if a
    cancel asked for meanwhile ended it instead."""
    return int(client.register_script(_PAUSE)(keys=[keys.job(job_id), keys.lease(job_id), keys.ACTIVE],
                                              args=[token, now(), reason, job_id]))


def continue_job(client: redis.Redis, job_id: str, pause_at: Optional[int], why: str,
                 paused_at: Optional[int] = None) -> int:
    """Queue a paused job again, to pause next at ``pause_at`` (None: to train to its end): the attempt to
    publish (the record is marked for it), or -1 when the job is not paused (or, given ``paused_at``, not
    paused at that pause_at: a search continues a trial from one rung only once)."""
    return int(client.register_script(_CONTINUE)(keys=[keys.job(job_id), keys.ACTIVE], args=[
        job_id, now(), "" if pause_at is None else str(pause_at), why, "" if paused_at is None else str(paused_at)]))
