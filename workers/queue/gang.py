"""The gang of a multi-node job: the workers that run one attempt together, admitted all or nothing.

A job on N nodes needs N distinct live workers of its queue at once. The gang forms in Redis, each
change one script, as Kueue admits a workload only when all its pods can start:

- **The leader** is the worker that took the message of the job's next attempt. It opens the gang
  (``form``) and publishes N-1 join messages to the job's queue; it does not claim the attempt yet.
- **Followers** are workers that take a join message (``join``). Each gets a node index (1..N-1)
  and a lease of its own, renewed while it waits and while it runs. Members are distinct hosts
  (``distinct: host``); workers sharing a host stand for nodes only where told to (``worker``: tests,
  one machine).
- **Admission** (``admit``, by the leader): once N have joined and every follower's lease is alive
  (a follower that died while waiting is dropped, and its place offered again), the gang is
  admitted. Only then does the leader claim the attempt, as any worker claims a job, and publish
  the rendezvous (``start``).
- **Nothing is used up by a gang that does not fill.** The leader dissolves it when its timeout
  passes, and passes the message on: no attempt is claimed, no loss counted. The job's record says
  why it waits ("waiting for nodes: 1 of 2 joined").
- **No deadlock.** One gang forms at a time on a queue (``keys.queue_forming``, expiring with the
  gang's timeout). Two gangs can therefore never each hold part of the pool while they wait for
  the rest: a leader that finds another gang forming passes its message on at once, which frees its
  worker to join the gang that is forming. A worker is in one gang at most: it holds the Celery task
  of its membership while it waits and runs, so its queue gives it nothing else meanwhile.
- **A leader that dies while forming** stops renewing the gang, which expires; its followers see it
  gone and leave, and the reaper publishes the message again (the leader's renewals had kept the
  message's ``published_at`` fresh, so that the reaper did not publish copies while it formed).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Optional

import redis

from baton.jobs import keys
from baton.jobs.records import now

# KEYS: forming slot, gang, job. ARGV: job id, attempt, nodes, worker, host, timeout ms, gang ttl ms, now, gang id.
# A dissolved gang's record (kept for its followers to read why) gives way to a new one.
_FORM = """
local state = redis.call('HGET', KEYS[3], 'state')
if state ~= 'queued' and state ~= 'retrying' then return {'state', state or 'missing'} end
if tonumber(redis.call('HGET', KEYS[3], 'attempt')) + 1 ~= tonumber(ARGV[2]) then return {'stale'} end
local mine = ARGV[1] .. ':' .. ARGV[2]
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= mine then return {'busy', holder} end
local existing = redis.call('HGET', KEYS[2], 'state')
if existing and existing ~= 'dissolved' then return {'duplicate'} end
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[1], mine, 'PX', ARGV[6])
redis.call('HSET', KEYS[2], 'id', ARGV[9], 'attempt', ARGV[2], 'nodes', ARGV[3], 'state', 'forming', 'joined', 1,
           'worker:0', ARGV[4], 'host:0', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
redis.call('HSET', KEYS[3], 'published_at', ARGV[8], 'updated_at', ARGV[8],
           'last_event', 'waiting for nodes: 1 of ' .. ARGV[3] .. ' joined')
return {'ok'}
"""

# KEYS: gang, job, member leases of nodes 1..N-1. ARGV: attempt, worker, host, distinct (host|worker),
# lease ttl ms, nonce, now. A follower takes the lowest free node index.
_JOIN = """
if redis.call('HGET', KEYS[1], 'state') ~= 'forming' then return {'closed'} end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return {'stale'} end
local nodes = tonumber(redis.call('HGET', KEYS[1], 'nodes'))
if #KEYS ~= nodes + 1 then return {'nodes'} end
local free = nil
for k = 0, nodes - 1 do
  local member = redis.call('HGET', KEYS[1], 'worker:' .. k)
  if member == ARGV[2] then return {'member'} end
  if member and ARGV[4] == 'host' and redis.call('HGET', KEYS[1], 'host:' .. k) == ARGV[3] then
    return {'same-host', member}
  end
  if not member and not free and k > 0 then free = k end
end
if not free then return {'full'} end
local token = ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[6]
redis.call('SET', KEYS[free + 2], token, 'PX', ARGV[5])
local joined = redis.call('HINCRBY', KEYS[1], 'joined', 1)
redis.call('HSET', KEYS[1], 'worker:' .. free, ARGV[2], 'host:' .. free, ARGV[3])
redis.call('HSET', KEYS[2], 'updated_at', ARGV[7],
           'last_event', 'waiting for nodes: ' .. joined .. ' of ' .. nodes .. ' joined')
return {'ok', tostring(free), token, redis.call('HGET', KEYS[1], 'id')}
"""

# KEYS: gang, job. ARGV: attempt, gang ttl ms, now. The leader's renewal while the gang lives.
_RENEW_GANG = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('HGET', KEYS[1], 'state') == 'forming' then
  redis.call('HSET', KEYS[2], 'published_at', ARGV[3])
end
return 1
"""

# KEYS: member lease. ARGV: token, ttl ms.
_RENEW_MEMBER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: forming slot, gang, job, member leases of nodes 1..N-1. ARGV: job id, attempt, now. Drops the
# followers whose lease lapsed; admits a full gang (and frees the queue's forming slot).
_ADMIT = """
if redis.call('HGET', KEYS[2], 'state') ~= 'forming' then return {'closed', '0'} end
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return {'closed', '0'} end
local nodes = tonumber(redis.call('HGET', KEYS[2], 'nodes'))
for k = 1, nodes - 1 do
  if redis.call('HEXISTS', KEYS[2], 'worker:' .. k) == 1 and redis.call('EXISTS', KEYS[k + 3]) == 0 then
    redis.call('HDEL', KEYS[2], 'worker:' .. k, 'host:' .. k)
    redis.call('HINCRBY', KEYS[2], 'joined', -1)
  end
end
local joined = tonumber(redis.call('HGET', KEYS[2], 'joined'))
if joined < nodes then
  redis.call('HSET', KEYS[3], 'last_event', 'waiting for nodes: ' .. joined .. ' of ' .. nodes .. ' joined')
  return {'forming', tostring(joined)}
end
redis.call('HSET', KEYS[2], 'state', 'admitted')
if redis.call('GET', KEYS[1]) == ARGV[1] .. ':' .. ARGV[2] then redis.call('DEL', KEYS[1]) end
return {'admitted', tostring(joined)}
"""

# KEYS: gang. ARGV: attempt, endpoint, secret.
_START = """
if redis.call('HGET', KEYS[1], 'state') ~= 'admitted' or redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'running', 'endpoint', ARGV[2], 'secret', ARGV[3])
return 1
"""

# KEYS: forming slot, gang, job. ARGV: job id, attempt, reason, keep ms, now.
_DISSOLVE = """
if redis.call('HGET', KEYS[2], 'attempt') ~= ARGV[2] then return 0 end
local was = redis.call('HGET', KEYS[2], 'state')
redis.call('HSET', KEYS[2], 'state', 'dissolved', 'reason', ARGV[3])
redis.call('HDEL', KEYS[2], 'secret', 'endpoint')
redis.call('PEXPIRE', KEYS[2], ARGV[4])
if redis.call('GET', KEYS[1]) == ARGV[1] .. ':' .. ARGV[2] then redis.call('DEL', KEYS[1]) end
if was == 'forming' or was == 'admitted' then
  redis.call('HSET', KEYS[3], 'updated_at', ARGV[5], 'last_event', ARGV[3])
end
return 1
"""

# KEYS: gang, member lease. ARGV: attempt, node, token. A follower leaves a gang still forming.
_LEAVE = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], 'attempt') == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'forming'
   and redis.call('HEXISTS', KEYS[1], 'worker:' .. ARGV[2]) == 1 then
  redis.call('HDEL', KEYS[1], 'worker:' .. ARGV[2], 'host:' .. ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'joined', -1)
end
return 1
"""

DISSOLVED_KEPT_S = 60.0
"""How long a dissolved gang's record stays, for its followers to read why."""


@dataclass(frozen=True)
class Gang:
    """A gang's record as read."""

    id: str
    state: str  # forming | admitted | running | dissolved
    attempt: int
    nodes: int
    joined: int
    workers: dict[int, str] = field(default_factory=dict)  # node index -> worker name
    hosts: dict[int, str] = field(default_factory=dict)
    endpoint: Optional[str] = None
    secret: Optional[str] = None
    reason: Optional[str] = None

    def describe(self) -> str:
        return f"{self.joined} of {self.nodes} nodes joined"


@dataclass(frozen=True)
class Membership:
    """A follower's place: its node index, the token of its lease, and the gang's id (a gang formed
    again for the same attempt, after this one was dissolved, has another)."""

    node: int
    token: str
    gang: str


class Gangs:
    """Every change to gangs, each one script (see the module's docstring)."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._form, self._join = client.register_script(_FORM), client.register_script(_JOIN)
        self._renew_gang, self._renew_member = client.register_script(_RENEW_GANG), client.register_script(_RENEW_MEMBER)
        self._admit, self._start = client.register_script(_ADMIT), client.register_script(_START)
        self._dissolve, self._leave = client.register_script(_DISSOLVE), client.register_script(_LEAVE)

    # --- the leader ----------------------------------------------------------------------------
    def form(self, job_id: str, queue: str, attempt: int, nodes: int, worker: str, host: str, timeout_s: float,
             ttl_s: float) -> tuple[str, Optional[str]]:
        """Open the gang for ``attempt`` (the message's: the record's attempt + 1), led by ``worker``.
        ('ok', None); ('busy', '<job>:<attempt>') when another gang is forming on ``queue``;
        ('duplicate', None) when another copy of this message leads it; ('stale'|'state', ...) when the
        message is not the job's next attempt."""
        result = self._form(keys=[keys.queue_forming(queue), keys.gang(job_id), keys.job(job_id)],
                            args=[job_id, attempt, nodes, worker, host, _ms(timeout_s), _ms(ttl_s), now(),
                                  secrets.token_hex(8)])
        return result[0], (result[1] if len(result) > 1 else None)

    def renew(self, job_id: str, attempt: int, ttl_s: float) -> bool:
        """Keep the gang (False: it is gone, or another attempt's)."""
        return bool(self._renew_gang(keys=[keys.gang(job_id), keys.job(job_id)], args=[attempt, _ms(ttl_s), now()]))

    def admit(self, job_id: str, queue: str, attempt: int, nodes: int) -> tuple[str, int]:
        """('admitted', N) once every node has joined and every follower's lease is alive;
        ('forming', joined) before; ('closed', 0) when the gang is no longer forming."""
        result = self._admit(keys=[keys.queue_forming(queue), keys.gang(job_id), keys.job(job_id),
                                   *_member_keys(job_id, nodes)], args=[job_id, attempt, now()])
        return result[0], int(result[1])

    def start(self, job_id: str, attempt: int, endpoint: str, secret: str) -> bool:
        """Publish the rendezvous of an admitted gang whose attempt the leader has claimed."""
        return bool(self._start(keys=[keys.gang(job_id)], args=[attempt, endpoint, secret]))

    def dissolve(self, job_id: str, queue: str, attempt: int, reason: str) -> bool:
        """End the gang (its followers leave); the record keeps ``reason`` for a while."""
        return bool(self._dissolve(keys=[keys.queue_forming(queue), keys.gang(job_id), keys.job(job_id)],
                                   args=[job_id, attempt, reason, _ms(DISSOLVED_KEPT_S), now()]))

    # --- a follower ----------------------------------------------------------------------------
    def join(self, job_id: str, attempt: int, nodes: int, worker: str, host: str, distinct: str,
             ttl_s: float) -> tuple[Optional[Membership], str]:
        """Join the gang forming for ``attempt``: (Membership, 'ok'), or (None, why not)."""
        result = self._join(keys=[keys.gang(job_id), keys.job(job_id), *_member_keys(job_id, nodes)],
                            args=[attempt, worker, host, distinct, _ms(ttl_s), secrets.token_hex(8), now()])
        if result[0] == "ok":
            return Membership(int(result[1]), result[2], result[3]), "ok"
        return None, " ".join(map(str, result))

    def renew_member(self, job_id: str, membership: Membership, ttl_s: float) -> bool:
        return bool(self._renew_member(keys=[keys.gang_member(job_id, membership.node)],
                                       args=[membership.token, _ms(ttl_s)]))

    def leave(self, job_id: str, attempt: int, membership: Membership) -> bool:
        """Give up a place (the lease ends; a gang still forming offers the place again)."""
        return bool(self._leave(keys=[keys.gang(job_id), keys.gang_member(job_id, membership.node)],
                                args=[attempt, membership.node, membership.token]))

    # --- anyone --------------------------------------------------------------------------------
    def read(self, job_id: str) -> Optional[Gang]:
        raw = self.client.hgetall(keys.gang(job_id))
        if not raw:
            return None
        nodes = int(raw["nodes"])
        workers = {k: raw[f"worker:{k}"] for k in range(nodes) if f"worker:{k}" in raw}
        hosts = {k: raw[f"host:{k}"] for k in range(nodes) if f"host:{k}" in raw}
        return Gang(raw["id"], raw["state"], int(raw["attempt"]), nodes, int(raw["joined"]), workers, hosts,
                    raw.get("endpoint"), raw.get("secret"), raw.get("reason"))


def _member_keys(job_id: str, nodes: int) -> list[str]:
    return [keys.gang_member(job_id, node) for node in range(1, nodes)]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
