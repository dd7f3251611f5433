"""A queue's pool in Redis: which jobs wait, in which order they start, and which team holds how many
worker slots.

Each team has a line on each queue (``keys.queue_waiting``): a sorted set of ``<submit ms>:<job id>``
scored by minus the job's priority, so that a line reads in its start order (priority, then submit
time). Every script of the job's state machine that makes a job wait (submit, release, a lost lease,
resume) puts it in its line, and every one that ends the wait (a claim, a cancel) takes it out, in the
same atomic step (``LUA``): a line never disagrees with the records. A claim also adds the job's slots
(``resources.nodes``) to its team's use of the queue (``keys.queue_usage``), and every script that ends
a running attempt takes them away.

The queue's start order merges the teams' lines: the highest priority first; at one priority, the
team whose use is furthest below its quota (``baton quota``; none: 0) first, its use counted as if the
jobs before it had started; then the earliest submitted. A job that yields keeps its submit time.
The order is what a worker takes (``start_order``: the first one it can host) and what a user reads
(``baton queue``, ``position``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Hashable, Optional

import redis

from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, text, texts
from baton.storage.records.events import EVENT_LUA

if TYPE_CHECKING:
    from baton.storage.records.refusals import Placement

_P = keys.PREFIX + ":queue:"

LEASE_DUE_LUA = """
local function lease_due(id, ttl_ms)
  local t = redis.call('TIME')
  redis.call('ZADD', '@D', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl_ms), id)
  return t
end
""".replace("@D", keys.LEASES_DUE)
"""``lease_due`` alone (the renewal's script needs nothing else): when the reaper must look at a lease;
it returns the Redis TIME it read."""

LUA = LEASE_DUE_LUA + EVENT_LUA + """
local function pool_fields(job)
  local v = redis.call('HMGET', job, 'queue', 'team', 'priority', 'created_at', 'slots')
  return v[1] or 'default', v[2] or 'default', tonumber(v[3] or '0') or 0, tonumber(v[4] or '0') or 0,
         tonumber(v[5] or '1') or 1
end
local function pool_member(created, id)
  return string.format('%016.0f', created * 1000) .. ':' .. id
end
local function pool_wait(job, id)
  local q, team, priority, created = pool_fields(job)
  redis.call('ZADD', '@P' .. q .. ':waiting:' .. team, -priority, pool_member(created, id))
  redis.call('SADD', '@P' .. q .. ':teams', team)
  redis.call('SADD', '@Q', q)
end
local function pool_unwait(job, id)
  local q, team, priority, created = pool_fields(job)
  redis.call('ZREM', '@P' .. q .. ':waiting:' .. team, pool_member(created, id))
end
local function pool_run(job, id)
  local q, team, priority, created, slots = pool_fields(job)
  pool_unwait(job, id)
  if redis.call('HSETNX', '@P' .. q .. ':running', id, team .. ' ' .. slots .. ' ' .. priority) == 1 then
    redis.call('HINCRBY', '@P' .. q .. ':usage', team, slots)
  end
  local worker = redis.call('HGET', job, 'worker')
  if worker then redis.call('HSET', '@B', worker, id) end
end
local function pool_left(job, id)
  redis.call('ZREM', '@D', id)
  local q = redis.call('HGET', job, 'queue') or 'default'
  local worker = redis.call('HGET', job, 'worker')
  if worker and redis.call('HGET', '@B', worker) == id then redis.call('HDEL', '@B', worker) end
  redis.call('HDEL', '@P' .. q .. ':yielding', id)
  redis.call('HDEL', job, 'yield_requested', 'yield_for', 'yield_seen')
  local held = redis.call('HGET', '@P' .. q .. ':running', id)
  if not held then return end
  redis.call('HDEL', '@P' .. q .. ':running', id)
  local team, slots = string.match(held, '^(%S+) (%d+)')
  if team and redis.call('HINCRBY', '@P' .. q .. ':usage', team, -tonumber(slots)) <= 0 then
    redis.call('HDEL', '@P' .. q .. ':usage', team)
  end
end
local function cancel_if_asked(job, id, now, how)
  if not redis.call('HGET', job, 'cancel_requested') then return false end
  pool_left(job, id)
  local what = 'cancelled as it ' .. how
  redis.call('HSET', job, 'state', 'cancelled', 'updated_at', now, 'finished_at', now, 'last_event', what)
  job_event(job, now, 'cancelled', what)
  redis.call('DEL', job .. ':live')
  redis.call('HDEL', job, 'cancel_requested', 'publish_pending')
  redis.call('SREM', '@A', id)
  return true
end
""".replace("@P", _P).replace("@Q", keys.QUEUES).replace("@B", keys.BUSY).replace("@D", keys.LEASES_DUE).replace(
    "@A", keys.ACTIVE)
"""Functions the state machine's scripts call (each script is this text, then its own): ``pool_wait``
when a job starts waiting, ``pool_unwait`` when it stops without running, ``pool_run`` when it is
claimed (its worker is busy from then), ``pool_left`` when a running attempt ends (its worker is idle, and
a request that it yield is spent); ``lease_due`` when a lease is set or renewed (when the reaper must
look at it: ``keys.LEASES_DUE``); ``cancel_if_asked(job, id, now, how)`` wherever a running attempt ends
without finishing (a release, a loss, a lapsed lease): a cancel asked for meanwhile ends the job
``cancelled`` there (true), with its last committed checkpoint, instead of queueing it again."""

# KEYS: a team's line, the queue's teams. ARGV: the team. A team with nobody waiting leaves the set
# (in one step: a job put in the line meanwhile keeps it there).
_PRUNE_TEAM = """
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return 1
"""

# KEYS: a team's line, the job. ARGV: the member. A line's entry whose job no longer waits (a record
# deleted by hand, or written before lines existed) is dropped.
_DROP_STALE = """
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'queued' or state == 'retrying' then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class Waiting:
    """A job waiting on a queue, as the start order sees it."""

    job_id: str
    name: str
    team: str
    priority: int
    submitted_at: float
    attempt: int  # the attempt a claim would start: the record's + 1
    slots: int
    position: int = 0  # 1-based, in the queue's start order
    needs: str = ""  # what it needs of a worker (``baton.schemas.hosting.JobNeeds``, JSON; "": unknown)
    submitted_by: str = ""  # the principal the pool's server submitted it for ("": submitted directly)


@dataclass(frozen=True)
class Running:
    job_id: str
    team: str
    slots: int
    priority: int = 0
    queue: str = ""  # "": the queue whose state holds it; else a job of that queue on this queue's workers
    here: Optional[int] = None  # the slots it holds on this queue's workers (None: all of them)

    @property
    def frees(self) -> int:
        """The slots its yield frees for this queue's jobs."""
        return self.slots if self.here is None else self.here


@dataclass
class QueueState:
    """One queue's waiting jobs in start order, its running jobs, and each team's use and quota."""

    queue: str
    waiting: list[Waiting] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    quotas: dict[str, int] = field(default_factory=dict)
    neighbours: list[Running] = field(default_factory=list)
    """Jobs of other queues running on workers that serve this one too (a worker's slot is one slot,
    whatever queue it serves): the scheduler's turn reads them (``with_neighbours``)."""
    elsewhere: dict[str, tuple[dict[str, int], dict[str, int]]] = field(default_factory=dict)
    """The neighbours' queues: each one's (usage, quotas) by team, which says whether a neighbour is borrowed."""

    def find(self, job_id: str) -> Optional[Waiting]:
        return next((w for w in self.waiting if w.job_id == job_id), None)


class Pool:
    """Reads of the queues' lines, and their repair (``_PRUNE_TEAM``, ``_DROP_STALE``)."""

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._prune = client.register_script(_PRUNE_TEAM)
        self._drop = client.register_script(_DROP_STALE)

    def state(self, queue: str, limit: Optional[int] = None) -> QueueState:
        """``queue`` as it stands; ``limit``: at most this many of each team's line are read (a worker
        choosing its next job needs the first few; a user's view, all)."""
        usage, quotas = self.usage(queue), self.quotas_of(queue)
        running = [Running(job_id, *_held(value)) for job_id, value in
                   sorted(texts(self.redis.hgetall(keys.queue_running(queue))).items())]
        lines = {team: self._line(queue, team, limit) for team in sorted(map(text, self.redis.smembers(keys.queue_teams(queue))))}
        waiting = _merge(lines, dict(usage), quotas)
        return QueueState(queue, waiting, running, usage, quotas)

    def _line(self, queue: str, team: str, limit: Optional[int]) -> list[Waiting]:
        line = keys.queue_waiting(queue, team)
        if limit == 0:
            return []
        entries: list[tuple[str, float]] = self.redis.zrange(line, 0, -1 if limit is None else limit - 1,
                                                             withscores=True)  # type: ignore[assignment]
        if not entries:
            self._prune(keys=[line, keys.queue_teams(queue)], args=[team])
            return []
        pipe = self.redis.pipeline(transaction=False)
        for member, _ in entries:
            pipe.hmget(keys.job(text(member).split(":", 1)[1]), ["state", "attempt", "name", "slots", "created_at",
                                                                 "needs", "submitted_by"])
        found = []
        for (member, score), (state, attempt, name, slots, created, needs, by) in zip(entries, pipe.execute()):
            job_id = text(member).split(":", 1)[1]
            if maybe_text(state) not in ("queued", "retrying"):
                self._drop(keys=[line, keys.job(job_id)], args=[member])
                continue
            found.append(Waiting(job_id, maybe_text(name) or job_id, team, -_record_number(score, 0),
                                 _record_number(created, 0, float), _record_number(attempt, 0) + 1,
                                 max(1, _record_number(slots, 1)), needs=maybe_text(needs) or "",
                                 submitted_by=maybe_text(by) or ""))
        return found


    def counts(self, queue: str) -> tuple[int, int]:
        """(jobs waiting, worker slots held) on ``queue``: one read per team, none per job."""
        teams = sorted(map(text, self.redis.smembers(keys.queue_teams(queue))))
        pipe = self.redis.pipeline(transaction=False)
        for team in teams:
            pipe.zcard(keys.queue_waiting(queue, team))
        waiting = sum(pipe.execute()) if teams else 0
        return waiting, sum(self.usage(queue).values())

    def usage(self, queue: str) -> dict[str, int]:
        """Each team's worker slots in use on ``queue``."""
        return {team: int(n) for team, n in texts(self.redis.hgetall(keys.queue_usage(queue))).items()}

    def quotas_of(self, queue: str) -> dict[str, int]:
        """Each team's quota on ``queue`` (slots)."""
        return {team: int(n) for team, n in texts(self.redis.hgetall(keys.quota(queue))).items()}

    def queues(self) -> list[str]:
        return sorted(map(text, self.redis.smembers(keys.QUEUES)))

    def live_workers(self, queue: str) -> list[str]:
        """The workers whose announcement that they serve ``queue`` has not lapsed."""
        seconds, micros = self.redis.time()
        return sorted(map(text, self.redis.zrangebyscore(keys.queue_workers(queue), seconds + micros / 1e6, "+inf")))

    def set_quota(self, queue: str, team: str, slots: int) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(keys.quota(queue), team, slots)
        pipe.sadd(keys.QUEUES, queue)
        pipe.execute()

    def remove_quota(self, queue: str, team: str) -> bool:
        """False when ``team`` had no quota on ``queue``."""
        return bool(self.redis.hdel(keys.quota(queue), team))

    def quotas(self) -> dict[str, dict[str, int]]:
        """Every queue's quotas: queue -> team -> slots."""
        found = {}
        for queue in self.queues():
            quotas = self.quotas_of(queue)
            if quotas:
                found[queue] = quotas
        return found

    def remaining_s(self, state: QueueState) -> list[Optional[float]]:
        """Each running job's estimated time left (steps left / its last step rate); None where unknown."""
        pipe = self.redis.pipeline(transaction=False)
        for job in state.running:
            pipe.hmget(keys.job(job.job_id), ["step", "total_steps", "steps_per_s"])
        left: list[Optional[float]] = []
        for job, values in zip(state.running, pipe.execute()):
            step, total, rate = (_number(value) for value in values)
            known = step is not None and total is not None and rate is not None and rate > 0
            one = (total - step) / rate if known else None  # type: ignore[operator]
            left.extend([one] * job.slots)  # a job on N nodes frees N slots when it ends
        return left


def _number(value: object) -> Optional[float]:
    """A record's numeric field, None when absent or not a number (a stream's unknown total)."""
    try:
        return float(text(value)) if value is not None else None
    except ValueError:
        return None


def _held(value: str) -> tuple[str, int, int]:
    """A running entry's ``<team> <slots> <priority>`` (an entry written before priorities: priority 0)."""
    parts = value.split(" ")
    return (parts[0], max(1, _record_number(parts[1], 1)) if len(parts) > 1 else 1,
            _record_number(parts[2], 0) if len(parts) > 2 else 0)


def _record_number(value, default, kind=int):
    """``value`` (bytes, text or a number) as ``kind``, clamped to what a spec allows; ``default`` when it is
    not a finite number: a record written by hand must not stop every worker's scheduler (it orders last)."""
    try:
        number = float(text(value) if isinstance(value, (bytes, str)) else value)
    except (TypeError, ValueError):
        return default
    if number != number or number in (float("inf"), float("-inf")):
        return default
    return kind(max(-LIMIT, min(LIMIT, number)))


LIMIT = 1e15
"""The largest magnitude a record's number is read as (priorities are within +-1e9, times within 1e10)."""


def merged_order(states: list[QueueState]) -> list[Waiting]:
    """The start order of a worker that serves several queues (``states``, their waiting jobs as read): as
    one queue's, by priority, then by how far the job's team is below its quota *on the job's own queue*,
    then by submit time. (A worker freed so that a team below its quota on one queue gets its slot must
    start that team's job, not an older one of another queue: else it yields back and forth.)"""
    lines: dict[Hashable, list[Waiting]] = {}
    usage: dict[Hashable, int] = {}
    quotas: dict[Hashable, int] = {}
    for state in states:
        for job in state.waiting:
            lines.setdefault((state.queue, job.team), []).append(job)
        usage.update({(state.queue, team): n for team, n in state.usage.items()})
        quotas.update({(state.queue, team): n for team, n in state.quotas.items()})
    return _merge(lines, usage, quotas)


def _merge(lines: dict[Any, list[Waiting]], usage: dict[Any, int], quotas: dict[Any, int]) -> list[Waiting]:
    """The teams' lines as one start order: at each place, the head that comes first by (priority,
    its team's use minus its quota, submit time), its team's use then counted with its slots."""
    heads = {team: 0 for team, line in lines.items() if line}
    order: list[Waiting] = []
    while heads:
        def rank(team: Any) -> tuple[int, int, float, str]:
            head = lines[team][heads[team]]
            return -head.priority, usage.get(team, 0) - quotas.get(team, 0), head.submitted_at, head.job_id
        team = min(heads, key=rank)
        head = lines[team][heads[team]]
        order.append(Waiting(**{**head.__dict__, "position": len(order) + 1}))
        usage[team] = usage.get(team, 0) + head.slots
        heads[team] += 1
        if heads[team] == len(lines[team]):
            del heads[team]
    return order


def why_waiting(state: QueueState, job: Waiting, placement: "Placement") -> str:
    """Why ``job`` waits, in one line: what stands before it in ``state``'s start order, else whether a
    live worker of the queue is free to start it (``placement``: the queue's workers as they stand, a
    worker busy with a job of another queue it serves included)."""
    ahead = [other for other in state.waiting[:job.position - 1] if not placement.nowhere(other.job_id)]
    higher = sum(1 for other in ahead if other.priority > job.priority)  # (a job nothing can host holds up none)
    quota, used = state.quotas.get(job.team), state.usage.get(job.team, 0)
    if higher:
        return f"behind {higher} job(s) of higher priority"
    standing = used - (quota or 0)
    if quota is not None and used >= quota and any(
            other.team != job.team and other.priority == job.priority
            and state.usage.get(other.team, 0) - state.quotas.get(other.team, 0) < standing for other in ahead):
        return f"team {job.team} is at its quota of {quota} slot(s)"
    if ahead:
        return (f"behind {len(ahead)} job(s) of priority {job.priority} submitted earlier or of teams further "
                "below their quota")
    if placement.idle_for(job.job_id) >= job.slots:
        return f"next to start: a free worker of queue {state.queue} takes it within moments"
    drained = placement.served - len(placement.live)
    if drained and not placement.live:
        return f"next to start: every worker serving queue {state.queue} is drained (`baton undrain WORKER`)"
    busy = "busy" if not drained else f"busy or drained ({drained} drained)"
    return f"next to start: every worker serving queue {state.queue} is {busy}"


def starts_in(state: QueueState, job: Waiting, remaining_s: list[Optional[float]]) -> Optional[float]:
    """When ``job`` may start, in seconds: when the running job that frees its place ends (each waiting
    job before it taking the one before), if every running job's time left is known (``remaining_s``,
    one per running job); None when its place needs more than the running jobs free."""
    if not remaining_s or any(left is None for left in remaining_s):
        return None
    ends = sorted(float(left) for left in remaining_s if left is not None)
    freed = sum(job.slots for job in state.waiting[:job.position - 1]) + job.slots
    return ends[freed - 1] if freed <= len(ends) else None
