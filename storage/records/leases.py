"""A worker's hold on a job: the claim that starts an attempt, and the renewal that keeps it.

The claim succeeds only for the message of the next attempt (``attempt == record.attempt + 1``)
of a job waiting for a worker, so a duplicate or stale delivery is dropped without training.
Each claim carries a random nonce, in its lease token and in the manifest's fencing token, so two
claims of one attempt number (Redis lost the first) are told apart. When the claimed attempt turns
out to be behind the manifest (Redis came back behind the object store: AOF loss, a promoted
replica, a restore from backup), the holder *catches up*: while its lease is still the job's, the
record's attempt jumps past the manifest's and the lease follows, in one script, and training goes
on under the new number (``claims.py``). Nothing is counted as lost.
``renew`` is one heartbeat's renewal (``baton.workers.queue.heartbeat`` sends them): it brings back
the job's cancel flag, the worker's stopping flag and the scheduler's request that the job yield
(``scheduling.py``), or the worker's drain (``baton drain``), with the lease; and it carries the
record's latest progress fields, fenced by the same lease, so that a running job's Redis traffic is
its renewals whatever its step rate.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Optional

import redis

from baton.storage.records import keys
from baton.storage.records.connection import text
from baton.storage.records.job_records import now
from baton.storage.records.events import EVENT_LUA
from baton.storage.records.pool import LEASE_DUE_LUA, LUA



_CLAIM = LUA + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing'} end
if state ~= 'queued' and state ~= 'retrying' then return {'state', state} end
local current = tonumber(redis.call('HGET', KEYS[1], 'attempt'))
if tonumber(ARGV[1]) ~= current + 1 then return {'stale', tostring(current)} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'leased'} end
redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[3])
lease_due(ARGV[6], ARGV[3])
redis.call('HSET', KEYS[1], 'state', 'running', 'attempt', ARGV[1], 'worker', ARGV[2], 'updated_at', ARGV[4],
           'claimed_at', ARGV[4])
job_event(KEYS[1], ARGV[4], 'claimed', 'claimed by ' .. ARGV[2], 'worker')
redis.call('HDEL', KEYS[1], 'publish_pending', 'published_at', 'republished', 'error', 'traceback', 'failure', 'yielded')
pool_run(KEYS[1], ARGV[6])
return {'ok'}
"""

# KEYS: job, lease. ARGV: token, attempt, new attempt, new token, ttl ms, now, job id. 1 when caught up.
_CATCH_UP = LEASE_DUE_LUA + """
local held = redis.call('GET', KEYS[2])
if held == ARGV[4] and tonumber(redis.call('HGET', KEYS[1], 'attempt')) == tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  lease_due(ARGV[7], ARGV[5])
  return 1
end
if held ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt')) ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
lease_due(ARGV[7], ARGV[5])
redis.call('HSET', KEYS[1], 'attempt', ARGV[3], 'updated_at', ARGV[6], 'last_event',
           'attempt ' .. ARGV[2] .. ' was behind the manifest (Redis was behind the store): caught up as attempt ' .. ARGV[3])
return 1
"""

# KEYS: lease, job, the worker's stopping flag, its drain mark. ARGV: token, ttl ms, job id, field/value pairs...
_RENEW = LEASE_DUE_LUA + EVENT_LUA + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {0, 0, 0, ''} end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local clock = lease_due(ARGV[3], ARGV[2])
local flags = redis.call('HMGET', KEYS[2], 'cancel_requested', 'yield_requested', 'live_step', 'loss', 'lr')
if #ARGV > 3 then  -- progress: written, and a live point when its step moved (one HSET for both)
  local fields, set = {}, {unpack(ARGV, 4)}
  for i = 4, #ARGV - 1, 2 do fields[ARGV[i]] = ARGV[i + 1] end
  local loss = fields.loss or flags[4]
  if fields.step and loss and fields.step ~= flags[3] then
    live_point(KEYS[2], clock, fields.step, loss, fields.lr or flags[5])
    set[#set + 1] = 'live_step'
    set[#set + 1] = fields.step
  end
  redis.call('HSET', KEYS[2], unpack(set))
end
local worker = redis.call('MGET', KEYS[3], KEYS[4])
local why = flags[2] or ''
if why ~= '' then redis.call('HSETNX', KEYS[2], 'yield_seen', '1') end  -- read: the scheduler cannot withdraw it now
if why == '' and worker[2] then why = 'drained' end
return {1, flags[1] == '1' and 1 or 0, worker[1] and 1 or 0, why}
"""


@dataclass(frozen=True)
class Claim:
    ok: bool
    reason: str = ""
    nonce: str = ""
    token: str = ""


def new_nonce() -> str:
    """A claim's own random id: what tells two claims of one attempt number apart."""
    return secrets.token_hex(8)


def claim(client: redis.Redis, job_id: str, attempt: int, worker: str, ttl_s: float, nonce: str = "") -> Claim:
    nonce = nonce or new_nonce()
    held = token(attempt, worker, nonce)
    script = client.register_script(_CLAIM)
    result = script(keys=[keys.job(job_id), keys.lease(job_id)],
                    args=[attempt, worker, int(ttl_s * 1000), now(), held, job_id])
    if result[0] == "ok":
        return Claim(True, nonce=nonce, token=held)
    return Claim(False, reason=" ".join(map(str, result)))


def catch_up(client: redis.Redis, job_id: str, held: str, attempt: int, new_attempt: int, new_token: str,
             ttl_s: float) -> bool:
    """Move a running claim from ``attempt`` to ``new_attempt`` (past the manifest's), if ``held`` is
    still the job's lease and the record still at ``attempt``; False otherwise (another worker owns it)."""
    script = client.register_script(_CATCH_UP)
    return bool(script(keys=[keys.job(job_id), keys.lease(job_id)],
                       args=[held, attempt, new_attempt, new_token, int(ttl_s * 1000), now(), job_id]))


def attempt_of(lease_token: str) -> int:
    return int(lease_token.split(":", 1)[0])


def token(attempt: int, worker: str, nonce: str = "") -> str:
    """The lease's value: ``<attempt>:<worker>[:<nonce>]``."""
    return f"{attempt}:{worker}:{nonce}" if nonce else f"{attempt}:{worker}"


@dataclass(frozen=True)
class Renewal:
    held: bool  # the lease was still this token's, and now lives another TTL
    cancel_requested: bool
    worker_stopping: bool
    yield_requested: str = ""  # why the job must yield its worker: the scheduler's words, or "drained" ("": it need not)


class Renewer:
    """One job's lease renewals for one worker (the script registered once)."""

    def __init__(self, client: redis.Redis, job_id: str, worker: str):
        self._script = client.register_script(_RENEW)
        self._job_id = job_id
        self._keys = [keys.lease(job_id), keys.job(job_id), keys.worker_stopping(worker), keys.worker_drained(worker)]

    def __call__(self, lease_token: str, ttl_ms: int, fields: Optional[dict[str, object]] = None) -> Renewal:
        """Renew; ``fields`` are written to the job's record in the same step, if the lease holds."""
        flat = [str(item) for pair in (fields or {}).items() for item in pair]
        held, cancel, stopping, why = self._script(keys=self._keys, args=[lease_token, ttl_ms, self._job_id, *flat])
        return Renewal(bool(held), bool(cancel), bool(stopping), text(why))
