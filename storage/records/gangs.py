"""The gang of a multi-node job: the workers that run one attempt together, admitted all or nothing.

A job on N nodes needs N distinct live workers of its queue at once. The gang forms in Redis, each
change one script, as Kueue admits a workload only when all its pods can start:

- **The leader** is the worker that took the message of the job's next attempt. It opens the gang
  (``form``) and publishes N-1 join messages to the job's queue; it does not claim the attempt yet.
  Every later script of the leader names the gang by its id, so a leader that stalled past its gang's
  life cannot act on the gang another leader formed since.
- **Followers** are workers that take a join message (``join``). Each gets a node index (1..N-1)
  and a lease of its own, renewed while it waits and while it runs (a drained follower's renewal asks
  the running job to yield); a place whose lease lapsed is free again. Members are distinct hosts
  (``distinct: host``); workers sharing a host stand for nodes only where told to (``worker``: tests).
- **Admission** (``admit``, by the leader): once N have joined and every follower's lease is alive,
  the gang is admitted. Only then does the leader claim the attempt, as any worker claims a job,
  and publish the rendezvous (``start``).
- **A freed place is offered again.** A follower that leaves a forming gang, or whose lease lapses,
  frees its place; the scripts count each (``freed``), and the leader publishes a join message for
  each at once. A join message that a worker took and died with (SIGKILL) cannot be seen: while
  places are missing, the leader offers them again every ``REOFFER_S``. A join message beyond the
  missing places is dropped by the worker that takes it (the gang is full, or gone).
- **Nothing is used up by a gang that does not fill.** The leader dissolves it when its timeout
  passes and passes the message on: no attempt is claimed, no loss counted. The job's record says
  why it waits ("waiting for nodes: 1 of 2 joined").
- **No deadlock within a queue.** One gang forms at a time on a queue (``keys.queue_forming``, held
  while its leader renews it). Two gangs of one queue therefore never each hold part of its workers
  while they wait for the rest: a leader that finds another gang forming passes its message on at
  once, which frees its worker to join the gang that is forming. A worker is in one gang at most: it
  holds the Celery task of its membership while it waits and runs, so its queue gives it nothing
  else meanwhile. (Give multi-node jobs queues of their own workers: a worker serving several queues
  can be held by a gang forming on one while another forms on the next.)
- **A leader that dies while forming** stops renewing: its gang and the queue's slot expire within a
  lease TTL, its followers see the gang gone and leave, and the reaper publishes the message again
  (the leader's renewals had kept the message's ``published_at`` fresh, so that the reaper published
  no copies while it formed). A gang left by an earlier attempt gives way to the next attempt's.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Optional

import redis

from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, texts
from baton.storage.records.job_records import now

# The scripts' shared parts. waiting: whether the job still waits for a worker (a cancelled one does not);
# waiting_for: what its status says meanwhile (with why a worker was not taken, if one was not).
_WAITING = """
local function waiting(job)
  local state = redis.call('HGET', job, 'state')
  return state == 'queued' or state == 'retrying'
end
local function waiting_for(gang, joined, nodes)
  local refused = redis.call('HGET', gang, 'refused')
  return 'waiting for nodes: ' .. joined .. ' of ' .. nodes .. ' joined' .. (refused and ('; ' .. refused) or '')
end
"""

# KEYS: forming slot, gang, job. ARGV: job id, attempt, nodes, worker, host, gang ttl ms, now, gang id.
# A gang of an older attempt (its leader died with it) or a dissolved one gives way to the new one; a
# live gang of this attempt is another copy of the message's.
_FORM = _WAITING + """
if not waiting(KEYS[3]) then return {'state', redis.call('HGET', KEYS[3], 'state') or 'missing'} end
if tonumber(redis.call('HGET', KEYS[3], 'attempt')) + 1 ~= tonumber(ARGV[2]) then return {'stale'} end
local mine = ARGV[1] .. ':' .. ARGV[2]
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= mine then return {'busy', holder} end
local existing = redis.call('HGET', KEYS[2], 'state')
if existing and existing ~= 'dissolved' and redis.call('HGET', KEYS[2], 'attempt') == ARGV[2] then
  return {'duplicate'}
end
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[1], mine, 'PX', ARGV[6])
redis.call('HSET', KEYS[2], 'id', ARGV[8], 'attempt', ARGV[2], 'nodes', ARGV[3], 'state', 'forming', 'joined', 1,
           'worker:0', ARGV[4], 'host:0', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('HSET', KEYS[3], 'published_at', ARGV[7], 'updated_at', ARGV[7],
           'last_event', 'waiting for nodes: 1 of ' .. ARGV[3] .. ' joined')
return {'ok', ARGV[8]}
"""

# The places of followers whose lease lapsed are freed (KEYS[first + k - 1]: node k's lease).
_FREE_LAPSED = """
local function free_lapsed(gang, first)
  local nodes = tonumber(redis.call('HGET', gang, 'nodes'))
  for k = 1, nodes - 1 do
    if redis.call('HEXISTS', gang, 'worker:' .. k) == 1 and redis.call('EXISTS', KEYS[first + k - 1]) == 0 then
      redis.call('HDEL', gang, 'worker:' .. k, 'host:' .. k)
      redis.call('HINCRBY', gang, 'joined', -1)
      redis.call('HINCRBY', gang, 'freed', 1)
    end
  end
  return nodes
end
"""

# KEYS: gang, job, member leases of nodes 1..N-1. ARGV: attempt, worker, host, distinct (host|worker),
# lease ttl ms, nonce, now. A follower takes the lowest free node index (a lapsed follower's is free).
_JOIN = _WAITING + _FREE_LAPSED + """
if redis.call('HGET', KEYS[1], 'state') ~= 'forming' then return {'closed'} end
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return {'stale'} end
if not waiting(KEYS[2]) then return {'closed'} end
local nodes = tonumber(redis.call('HGET', KEYS[1], 'nodes'))
if #KEYS ~= nodes + 1 then return {'nodes'} end
free_lapsed(KEYS[1], 3)
local free = nil
for k = 0, nodes - 1 do
  local member = redis.call('HGET', KEYS[1], 'worker:' .. k)
  if member == ARGV[2] then return {'member'} end
  if member and ARGV[4] == 'host' and redis.call('HGET', KEYS[1], 'host:' .. k) == ARGV[3] then
    redis.call('HSET', KEYS[1], 'refused', ARGV[2] .. ' did not join: it is on the host of ' .. member ..
               ' (nodes are distinct hosts; BATON_GANG_DISTINCT)')
    return {'same-host', member}
  end
  if not member and not free and k > 0 then free = k end
end
if not free then return {'full'} end
local token = ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[6]
redis.call('SET', KEYS[free + 2], token, 'PX', ARGV[5])
local joined = redis.call('HINCRBY', KEYS[1], 'joined', 1)
redis.call('HSET', KEYS[1], 'worker:' .. free, ARGV[2], 'host:' .. free, ARGV[3])
redis.call('HSET', KEYS[2], 'updated_at', ARGV[7], 'last_event', waiting_for(KEYS[1], joined, nodes))
return {'ok', tostring(free), token, redis.call('HGET', KEYS[1], 'id')}
"""

# KEYS: forming slot, gang, job. ARGV: gang id, gang ttl ms, now, job id, attempt. The leader's renewal of
# its live gang; while it forms, of the queue's forming slot too, and of the message's published_at (the
# reaper publishes no copy of a message whose gang is forming).
_RENEW_GANG = """
if redis.call('HGET', KEYS[2], 'id') ~= ARGV[1] then return 0 end
local state = redis.call('HGET', KEYS[2], 'state')
if state ~= 'forming' and state ~= 'admitted' and state ~= 'running' then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if state == 'forming' then
  if redis.call('GET', KEYS[1]) == ARGV[4] .. ':' .. ARGV[5] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  redis.call('HSET', KEYS[3], 'published_at', ARGV[3])
end
return 1
"""

# KEYS: the member's lease, its worker's drain mark, the gang, the job. ARGV: token, ttl ms, gang id, why, job id.
_RENEW_MEMBER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('HGET', KEYS[3], 'id') == ARGV[3] then
  local gang, job = redis.call('HGET', KEYS[3], 'state'), redis.call('HMGET', KEYS[4], 'state', 'yield_requested')
  if gang == 'forming' then return 0 end  -- drained while its gang forms: it leaves, its place offered again
  if gang == 'running' and job[1] == 'running' and (job[2] or '') == '' then  -- (the mark names the job: presence's undrain)
    redis.call('HSET', KEYS[4], 'yield_requested', ARGV[4]); redis.call('SET', KEYS[2], ARGV[5]) end
end
return 1
"""

# KEYS: forming slot, gang, job, member leases of nodes 1..N-1. ARGV: gang id, job id, attempt. Frees the
# places of followers whose lease lapsed; admits a full gang (and frees the queue's forming slot).
_ADMIT = _WAITING + _FREE_LAPSED + """
if redis.call('HGET', KEYS[2], 'id') ~= ARGV[1] or redis.call('HGET', KEYS[2], 'state') ~= 'forming' then
  return {'closed', '0'}
end
if not waiting(KEYS[3]) then return {'closed', '0'} end
local nodes = free_lapsed(KEYS[2], 4)
if #KEYS ~= nodes + 2 then return {'nodes', '0'} end
local joined = tonumber(redis.call('HGET', KEYS[2], 'joined'))
if joined < nodes then
  redis.call('HSET', KEYS[3], 'last_event', waiting_for(KEYS[2], joined, nodes))
  return {'forming', tostring(joined)}
end
redis.call('HSET', KEYS[2], 'state', 'admitted')
local members = {}
for k = 0, nodes - 1 do members[#members + 1] = redis.call('HGET', KEYS[2], 'worker:' .. k) end
redis.call('HSET', KEYS[3], 'last_event', 'gang of ' .. nodes .. ' nodes admitted: ' .. table.concat(members, ', ') ..
           ' (the first leads)')
if redis.call('GET', KEYS[1]) == ARGV[2] .. ':' .. ARGV[3] then redis.call('DEL', KEYS[1]) end
return {'admitted', tostring(joined)}
"""

# KEYS: gang. ARGV: gang id, endpoint, secret, the ranks' arguments (JSON). Done again (a retry whose first
# reply was lost to a Redis outage), it says yes again.
_START = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
local state = redis.call('HGET', KEYS[1], 'state')
if state == 'running' and redis.call('HGET', KEYS[1], 'endpoint') == ARGV[2]
   and redis.call('HGET', KEYS[1], 'secret') == ARGV[3] then return 1 end
if state ~= 'admitted' then return 0 end
redis.call('HSET', KEYS[1], 'state', 'running', 'endpoint', ARGV[2], 'secret', ARGV[3], 'args', ARGV[4])
return 1
"""

# KEYS: gang. ARGV: gang id, field (failure|lost|released), value. A follower's report to its leader of
# why its ranks ended; the first stays.
_REPORT = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
for _, field in ipairs({'failure', 'lost', 'released'}) do
  if redis.call('HEXISTS', KEYS[1], field) == 1 then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""

# KEYS: gang. ARGV: gang id, node. A follower whose ranks all finished: its lease may lapse, not a loss.
_DONE = """
if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'done:' .. ARGV[2], '1')
return 1
"""

# KEYS: forming slot, gang, job. ARGV: gang id, job id, attempt, reason, keep ms, now.
_DISSOLVE = _WAITING + """
if redis.call('HGET', KEYS[2], 'id') ~= ARGV[1] then return 0 end
local was = redis.call('HGET', KEYS[2], 'state')
redis.call('HSET', KEYS[2], 'state', 'dissolved', 'reason', ARGV[4])
redis.call('HDEL', KEYS[2], 'secret', 'endpoint', 'args')
redis.call('PEXPIRE', KEYS[2], ARGV[5])
if redis.call('GET', KEYS[1]) == ARGV[2] .. ':' .. ARGV[3] then redis.call('DEL', KEYS[1]) end
if (was == 'forming' or was == 'admitted') and waiting(KEYS[3]) then
  redis.call('HSET', KEYS[3], 'updated_at', ARGV[6], 'last_event', ARGV[4])
end
return 1
"""

# KEYS: gang, member lease. ARGV: gang id, node, token. A follower gives up its place (a gang still
# forming offers it again).
_LEAVE = """
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[2])
if redis.call('HGET', KEYS[1], 'id') == ARGV[1] and redis.call('HGET', KEYS[1], 'state') == 'forming'
   and redis.call('HEXISTS', KEYS[1], 'worker:' .. ARGV[2]) == 1 then
  redis.call('HDEL', KEYS[1], 'worker:' .. ARGV[2], 'host:' .. ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'joined', -1)
  redis.call('HINCRBY', KEYS[1], 'freed', 1)
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
    secret: Optional[str] = field(default=None, repr=False)
    args: Optional[str] = field(default=None, repr=False)  # the ranks' arguments, as the leader gives its own (JSON)
    reason: Optional[str] = None  # why it was dissolved
    failure: Optional[str] = None  # a follower's report: the job's code failed on one of its ranks (JSON)
    lost: Optional[str] = None  # a follower's report: a rank or the node was lost
    released: Optional[str] = None  # a follower's report: its worker is shutting down
    refused: Optional[str] = None  # why a worker that took a join message did not join (the same host)
    done: frozenset = frozenset()  # the followers whose ranks all finished
    freed: int = 0  # places given up while it formed (a follower left, or its lease lapsed), each offered again

    def describe(self) -> str:
        return f"{self.joined} of {self.nodes} nodes joined"


@dataclass(frozen=True)
class Led:
    """A leader's gang: what every script of the leader names it by (its id: a gang formed again for the
    same attempt by another leader, after this one's expired, has another)."""

    job_id: str
    queue: str
    attempt: int
    nodes: int
    id: str


@dataclass(frozen=True)
class Membership:
    """A follower's place: its node index, the token of its lease, the gang's id (a gang formed again
    for the same attempt, after this one was dissolved, has another) and the follower's worker."""

    node: int
    token: str
    gang: str
    worker: str = ""


class Gangs:
    """Every change to gangs, each one script (see the module's docstring)."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._form, self._join = client.register_script(_FORM), client.register_script(_JOIN)
        self._renew_gang, self._renew_member = client.register_script(_RENEW_GANG), client.register_script(_RENEW_MEMBER)
        self._admit, self._start = client.register_script(_ADMIT), client.register_script(_START)
        self._dissolve, self._leave = client.register_script(_DISSOLVE), client.register_script(_LEAVE)
        self._report, self._done = client.register_script(_REPORT), client.register_script(_DONE)

    # --- the leader ----------------------------------------------------------------------------
    def form(self, job_id: str, queue: str, attempt: int, nodes: int, worker: str, host: str,
             ttl_s: float) -> tuple[str, Optional["Led"]]:
        """Open the gang for ``attempt`` (the message's: the record's attempt + 1), led by ``worker``,
        alive while the leader renews it within ``ttl_s``. ('ok', Led); ('busy', None) when another gang
        is forming on ``queue`` (``busy_with`` says whose); ('duplicate', None) when another copy of this
        message leads it; ('stale'|'state', None) when the message is not the job's next attempt."""
        gang_id = secrets.token_hex(8)
        result = self._form(keys=[keys.queue_forming(queue), keys.gang(job_id), keys.job(job_id)],
                            args=[job_id, attempt, nodes, worker, host, _ms(ttl_s), now(), gang_id])
        if result[0] == "ok":
            return "ok", Led(job_id, queue, attempt, nodes, gang_id)
        return result[0], None

    def busy_with(self, queue: str) -> Optional[str]:
        """The job whose gang is forming on ``queue``, if any."""
        holder = maybe_text(self.client.get(keys.queue_forming(queue)))
        return holder.rsplit(":", 1)[0] if holder else None

    def renew(self, led: "Led", ttl_s: float) -> bool:
        """Keep the leader's gang (and, while it forms, the queue's forming slot); False when it is gone,
        dissolved, or another leader's."""
        return bool(self._renew_gang(keys=[keys.queue_forming(led.queue), keys.gang(led.job_id), keys.job(led.job_id)],
                                     args=[led.id, _ms(ttl_s), now(), led.job_id, led.attempt]))

    def admit(self, led: "Led") -> tuple[str, int]:
        """('admitted', N) once every node has joined and every follower's lease is alive;
        ('forming', joined) before; ('closed', 0) when the gang no longer forms (or the job no longer waits)."""
        result = self._admit(keys=[keys.queue_forming(led.queue), keys.gang(led.job_id), keys.job(led.job_id),
                                   *_member_keys(led.job_id, led.nodes)], args=[led.id, led.job_id, led.attempt])
        return result[0], int(result[1])

    def start(self, led: "Led", endpoint: str, secret: str, args: str = "{}") -> bool:
        """Publish the rendezvous of an admitted gang whose attempt the leader has claimed, with the
        ranks' arguments (``args``, JSON)."""
        return bool(self._start(keys=[keys.gang(led.job_id)], args=[led.id, endpoint, secret, args]))

    def dissolve(self, led: "Led", reason: str) -> bool:
        """End the gang (its followers leave); the record keeps ``reason`` for a while."""
        return bool(self._dissolve(keys=[keys.queue_forming(led.queue), keys.gang(led.job_id), keys.job(led.job_id)],
                                   args=[led.id, led.job_id, led.attempt, reason, _ms(DISSOLVED_KEPT_S), now()]))

    # --- a follower ----------------------------------------------------------------------------
    def join(self, job_id: str, attempt: int, nodes: int, worker: str, host: str, distinct: str,
             ttl_s: float) -> tuple[Optional[Membership], str]:
        """Join the gang forming for ``attempt``: (Membership, 'ok'), or (None, why not)."""
        result = self._join(keys=[keys.gang(job_id), keys.job(job_id), *_member_keys(job_id, nodes)],
                            args=[attempt, worker, host, distinct, _ms(ttl_s), secrets.token_hex(8), now()])
        if result[0] == "ok":
            return Membership(int(result[1]), result[2], result[3], worker), "ok"
        return None, " ".join(map(str, result))

    def renew_member(self, job_id: str, membership: Membership, ttl_s: float) -> bool:
        member, worker = keys.gang_member(job_id, membership.node), keys.worker_drained(membership.worker)
        return bool(self._renew_member(keys=[member, worker, keys.gang(job_id), keys.job(job_id)], args=[
            membership.token, _ms(ttl_s), membership.gang, f"drained (node {membership.node}, {membership.worker})", job_id]))

    def leave(self, job_id: str, membership: Membership) -> bool:
        """Give up a place (the lease ends; a gang still forming offers the place again)."""
        return bool(self._leave(keys=[keys.gang(job_id), keys.gang_member(job_id, membership.node)],
                                args=[membership.gang, membership.node, membership.token]))

    def report(self, job_id: str, gang_id: str, what: str, value: str) -> bool:
        """Tell the leader why this node's ranks ended: ``failure`` (the job's code, JSON), ``lost``, or
        ``released`` (this worker is shutting down: not counted)."""
        return bool(self._report(keys=[keys.gang(job_id)], args=[gang_id, what, value]))

    def mark_done(self, job_id: str, gang_id: str, node: int) -> bool:
        """Node ``node``'s ranks all finished: its lease may end without its being lost."""
        return bool(self._done(keys=[keys.gang(job_id)], args=[gang_id, node]))

    def lapsed_members(self, job_id: str, gang: Gang) -> list[int]:
        """The followers of ``gang`` whose lease is gone (their worker died or was cut off) before their
        ranks finished."""
        nodes = [node for node in sorted(gang.workers) if node > 0 and node not in gang.done]
        if not nodes or self.client.exists(*[keys.gang_member(job_id, node) for node in nodes]) == len(nodes):
            return []
        return [node for node in nodes if not self.client.exists(keys.gang_member(job_id, node))]

    # --- anyone --------------------------------------------------------------------------------
    def read(self, job_id: str) -> Optional[Gang]:
        raw = texts(self.client.hgetall(keys.gang(job_id)))
        if not raw:
            return None
        nodes = int(raw["nodes"])
        workers = {k: raw[f"worker:{k}"] for k in range(nodes) if f"worker:{k}" in raw}
        hosts = {k: raw[f"host:{k}"] for k in range(nodes) if f"host:{k}" in raw}
        return Gang(raw["id"], raw["state"], int(raw["attempt"]), nodes, int(raw["joined"]), workers, hosts,
                    raw.get("endpoint"), raw.get("secret"), raw.get("args"), raw.get("reason"), raw.get("failure"),
                    raw.get("lost"), raw.get("released"), raw.get("refused"),
                    frozenset(k for k in range(nodes) if f"done:{k}" in raw), int(raw.get("freed", 0)))


def _member_keys(job_id: str, nodes: int) -> list[str]:
    return [keys.gang_member(job_id, node) for node in range(1, nodes)]


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
