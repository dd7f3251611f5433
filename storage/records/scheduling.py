"""The pool's scheduler: which running job yields its worker to a waiting one.

A yield costs baton nothing: the job checkpoints at its next optimizer step, commits, goes back to its
line uncounted (not a loss, not an attempt against ``retry.max_attempts``) with its submit time, and
resumes bit-exactly later. So the scheduler uses it freely, in two cases (``decide``):

- **priority**: a job waits, no slot of its queue is free, and a running job of strictly lower
  priority holds a slot it may take: one of its own team's, or one another team borrows (beyond
  that team's quota; with no quotas every slot is borrowed). Lowest priority first.
- **reclaim**: a job of a team below its quota waits and no slot is free: a job of a team above its
  quota gives back its borrowed slot, if its priority is no higher (a higher one would start again
  first: the queue's order is priority, then quota). Lowest priority first.

No worker is freed for a job it said it cannot host (``refusals``), and none for a job that every
live worker of the queue said no to. A job of N nodes takes N slots: it preempts as many as it needs,
or none. What stops two jobs from preempting each other back and forth: a job yields only to a
strictly higher priority of a team that may take its slot, or to a team below its quota when its own
team is above; after the swap the yielded job has neither (its priority is lower, its team is not below its quota), and a slot within
a team's quota is never taken by another team's priority. A job is never preempted by a job of equal
priority of its own team.

The decisions are made in one scheduler turn at a time, the reaper's (``reaping.take_turn``): one
worker per period reads each queue's heads of line, running jobs, quotas and idle workers (a few
commands per queue, none per job), decides, and marks each yield with ``_MARK``, which checks that the
job still runs on that queue. The mark reaches the job's worker with its next lease renewal
(``leases.renew``); the attempt's end (``pool.LUA``'s ``pool_left``) clears it. A marked job counts
as a free slot from the mark on, so the next turn does not preempt a second job for the same place.
A mark whose waiting job no longer waits (cancelled, started on a worker freed meanwhile) before the
marked job's worker read it is withdrawn at the next turn (``withdraw_stale``): that job trains on.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Optional

import redis

from baton.storage.records import keys, presence, refusals
from baton.storage.records.connection import maybe_text, text, texts
from baton.storage.records.pool import Pool, QueueState, Running, Waiting
from baton.storage.records.refusals import Placement

_log = logging.getLogger("baton.scheduler")

# KEYS: job, the queue's yielding hash, the queue's running hash, its cooling index. ARGV: job id, why,
# cooldown s, the waiting job it yields for. 1 when marked; 0 when the job no longer runs there, is marked
# already, or was marked within the cooldown (then the index lists it, if it did not: the next turn
# chooses another). Times are Redis's clock, as every reader of them.
_MARK = """
if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return 0 end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local last = tonumber(redis.call('HGET', KEYS[1], 'yield_marked_at') or '0') or 0
if now - last < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[4], last, ARGV[1])
  return 0
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
local at = string.format('%.6f', now)
redis.call('HSET', KEYS[1], 'yield_requested', ARGV[2], 'yield_marked_at', at, 'yield_for', ARGV[4])
redis.call('ZADD', KEYS[4], at, ARGV[1])
return 1
"""

# KEYS: the queue's cooling index. ARGV: the cooldown s. Drops the entries older than the cooldown (Redis's
# clock) and returns the others' job ids.
_COOLING = """
local clock = redis.call('TIME')
local since = string.format('%.6f', tonumber(clock[1]) + tonumber(clock[2]) / 1e6 - tonumber(ARGV[1]))
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. since)
return redis.call('ZRANGEBYSCORE', KEYS[1], since, '+inf')
"""

# KEYS: job, the queue's yielding hash, the job it was marked for, the queue's cooling index. ARGV: job id,
# that job's id. Withdraws
# the mark when the job it was for no longer waits (cancelled, started elsewhere, gone) and the marked
# job's worker has not read it yet (``leases.renew`` sets ``yield_seen``: from then on it is yielding).
# 1 when withdrawn.
_WITHDRAW = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'yield_for') ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], 'yield_seen') == 1 then
  return 0
end
local state = redis.call('HGET', KEYS[3], 'state')
if state == 'queued' or state == 'retrying' then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], 'yield_requested', 'yield_for', 'yield_marked_at')
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
"""

YIELD_COOLDOWN_S = 60.0
"""A job asked to yield is not asked again for this long: where the scheduler's picture is wrong (a
freed worker that cannot host the waiting job starts the yielded one again), a job yields at most
once a minute instead of every turn."""


@dataclass(frozen=True)
class Yield:
    """A running job asked to yield its worker, and why (its words end up in the job's events)."""

    job_id: str
    reason: str
    for_job: str
    kind: str = "priority"  # or "reclaim"


def decide(state: QueueState, idle_slots: int, yielding: set[str], cooling: frozenset[str] = frozenset(),
           placement: Placement = Placement()) -> list[Yield]:
    """The yields ``state`` calls for, with ``idle_slots`` free workers and the jobs of ``yielding``
    already asked (their slots count as free); the jobs of ``cooling`` (asked within the cooldown) are
    not asked again, and another is chosen in their place; no worker is freed for a job it said it
    cannot host (``placement``)."""
    return plan(state, idle_slots, yielding, cooling, placement)[0]


def plan(state: QueueState, idle_slots: int, yielding: set[str], cooling: frozenset[str] = frozenset(),
         placement: Placement = Placement()) -> tuple[list[Yield], list[str]]:
    """``decide``'s yields, and the waiting jobs that start once they are made (on free slots or freed
    ones). The waiting jobs are taken in start order: each takes free slots first (of idle workers that
    did not say they cannot host it), then, if it may, the slots of jobs that yield to it (likewise). One that can
    have neither keeps the free slots and every worker that did not say no to it: freed, such a worker
    would start it, not a job behind it (a worker takes the first job it can host); the jobs behind
    may have only the workers that said no to it, and the plan ends when there are none. A job every
    live worker said it cannot host is passed over: no worker would start it. The running jobs are the
    queue's own and its neighbours (jobs of other queues on workers that serve this one too); each is
    borrowed or not by its own queue's quota."""
    usage = {(state.queue, team): n for team, n in state.usage.items()}
    quotas = {(state.queue, team): n for team, n in state.quotas.items()}
    for other, (used, allowed) in state.elsewhere.items():
        usage.update({(other, team): n for team, n in used.items()})
        quotas.update({(other, team): n for team, n in allowed.items()})
    running = [job if job.queue else replace(job, queue=state.queue) for job in state.running + state.neighbours]
    free = idle_slots
    for job in running:
        if job.job_id in yielding:
            free += job.frees
            usage[(job.queue, job.team)] = usage.get((job.queue, job.team), 0) - job.slots
    candidates = [job for job in running if job.job_id not in yielding and job.job_id not in cooling]
    decisions: list[Yield] = []
    starts: list[str] = []
    spare: dict[str, int] = {}  # slots freed beyond a need (a gang's), by the job that frees them
    for waiting in state.waiting:
        if placement.nowhere(waiting.job_id):
            continue
        mine = (state.queue, waiting.team)
        usable = max(0, free - placement.idle_refusing(waiting.job_id))  # (an idle worker that said no: not for it)
        extra = [job_id for job_id in spare if placement.frees_for(job_id, waiting.job_id)]
        if waiting.slots <= usable + sum(spare[job_id] for job_id in extra):
            free -= min(usable, waiting.slots)
            _take(spare, extra, waiting.slots - min(usable, waiting.slots))
            usage[mine] = usage.get(mine, 0) + waiting.slots
            starts.append(waiting.job_id)
            continue
        hosts = [job for job in candidates if placement.frees_for(job.job_id, waiting.job_id)]
        need = waiting.slots - usable - _take(spare, extra, waiting.slots - usable)  # (all of them: too few)
        victims = _victims(waiting, state.queue, hosts, usage, quotas, need)
        free -= usable  # the free workers that may start it go to it (or to the gang it forms)
        if victims is None:  # so would a freed worker, unless it said no to it
            hosting = {job.job_id for job in hosts}  # (ids: a list's `in` made this O(running^2), 7 s at 10,000)
            candidates = [job for job in candidates if job.job_id not in hosting]
            if not candidates and not free and not spare:
                break
            continue
        usage[mine] = usage.get(mine, 0) + waiting.slots
        starts.append(waiting.job_id)
        freed = sum(victim.frees for victim, _, _ in victims)
        if freed > need:  # (a gang freed more than it needs)
            spare[max(victims, key=lambda chosen: chosen[0].frees)[0].job_id] = freed - need
        for victim, why, kind in victims:
            candidates.remove(victim)
            usage[(victim.queue, victim.team)] -= victim.slots
            decisions.append(Yield(victim.job_id, why, waiting.job_id, kind))
    return decisions, starts


def _take(spare: dict[str, int], eligible: list[str], wanted: int) -> int:
    """Take up to ``wanted`` of the ``eligible`` entries' spare slots; how many were taken."""
    taken = 0
    for job_id in eligible:
        share = min(spare[job_id], wanted - taken)
        spare[job_id] -= share
        taken += share
        if not spare[job_id]:
            del spare[job_id]
    return taken


def _victims(waiting: Waiting, queue: str, running: list[Running], usage: dict[tuple[str, str], int],
             quotas: dict[tuple[str, str], int], need: int) -> Optional[list[tuple[Running, str, str]]]:
    """Running jobs whose slots (``need`` of them at least) ``waiting`` (of ``queue``) may take, each with
    why; None when they are not enough (all or nothing). Lowest priority first, then the team furthest
    above its quota; among equals, the smallest jobs first, and then any chosen job of the last rank taken
    that the others already cover is let go (Kueue's fill-back, within a rank): a 2-node job is not stopped
    where a 1-node job of the same priority frees the slot needed, and no job is let go for a higher one.
    ``usage`` and ``quotas`` are by (queue, team): a job is borrowed or not by its own queue's quota."""
    usage = dict(usage)  # (each victim chosen leaves its team's use: the next borrowed() sees it gone)

    def borrowed(job: Running) -> bool:  # its team would still hold its quota without it
        return usage.get((job.queue, job.team), 0) - job.slots >= quotas.get((job.queue, job.team), 0)

    quota = quotas.get((queue, waiting.team))
    below = quota is not None and usage.get((queue, waiting.team), 0) + waiting.slots <= quota
    chosen: list[tuple[Running, str, str]] = []
    taken = 0
    rank = {job.job_id: (job.priority, quotas.get((job.queue, job.team), 0) - usage.get((job.queue, job.team), 0))
            for job in running}
    for job in sorted(running, key=lambda job: (rank[job.job_id], job.frees, job.job_id)):
        if taken >= need:
            break
        if job.priority < waiting.priority and (job.team == waiting.team or borrowed(job)):  # (named first: the cause)
            why, kind = f"yielded to job {waiting.job_id} (priority {waiting.priority})", "priority"
        elif job.team != waiting.team and below and job.priority <= waiting.priority and borrowed(job):
            why, kind = f"team {job.team}'s slot reclaimed by team {waiting.team}", "reclaim"
        else:
            continue
        chosen.append((job, why, kind))
        usage[(job.queue, job.team)] = usage.get((job.queue, job.team), 0) - job.slots
        taken += job.frees
    if taken < need:
        return None
    marginal = rank[chosen[-1][0].job_id] if chosen else None
    for victim in reversed(list(chosen)):  # (letting one go leaves its team's use higher: the others stay borrowed)
        if rank[victim[0].job_id] == marginal and taken - victim[0].frees >= need:
            chosen.remove(victim)
            taken -= victim[0].frees
    return chosen


class Scheduler:
    """One turn of decisions over every queue, and the marks that carry them to the jobs."""

    def __init__(self, client: redis.Redis):
        self.redis = client
        self.pool = Pool(client)
        self._mark = client.register_script(_MARK)
        self._withdraw = client.register_script(_WITHDRAW)
        self._cooling_now = client.register_script(_COOLING)

    def turn(self) -> list[Yield]:
        """Decide and mark every queue's yields; the ones marked. The turn is counted (``keys.SCHEDULER_TURNS``)."""
        marked = []
        for queue in self.pool.queues():
            marked.extend(self.queue_turn(queue))
        self.redis.incr(keys.SCHEDULER_TURNS)
        return marked

    def queue_turn(self, queue: str, heads: int = 16) -> list[Yield]:
        """``queue``'s yields: nothing is read beyond the first ``heads`` of each team's line while
        no job waits or a slot is free."""
        self.withdraw_stale(queue)
        if not any(self.redis.zcard(keys.queue_waiting(queue, team)) for team in
                   map(text, self.redis.smembers(keys.queue_teams(queue)))):
            return []
        state = self.pool.state(queue, limit=heads)
        if not state.waiting:
            return []
        yielding = set(texts(self.redis.hgetall(keys.queue_yielding(queue))))
        placement = refusals.place(self.redis, queue, state.waiting)
        state = self.with_neighbours(state, placement)
        for other in {job.queue for job in state.neighbours}:  # (their own yields are marked on their queue)
            yielding |= set(texts(self.redis.hgetall(keys.queue_yielding(other))))
        followers = self._followers([job.job_id for job in state.running + state.neighbours if job.slots > 1])
        placement = placement.without(worker for workers in followers.values() for worker in workers)
        decisions = decide(state, len(placement.idle), yielding, self._cooling(queue, state), placement)
        marked = []
        for decision in decisions:
            home = next((job.queue for job in state.neighbours if job.job_id == decision.job_id), queue)
            if self._mark(keys=[keys.job(decision.job_id), keys.queue_yielding(home), keys.queue_running(home),
                                keys.queue_cooling(home)],
                          args=[decision.job_id, decision.reason, YIELD_COOLDOWN_S, decision.for_job]):
                _log.warning("job %s asked to yield: %s", decision.job_id, decision.reason)
                marked.append(decision)
        return marked

    def with_neighbours(self, state: QueueState, placement: Placement) -> QueueState:
        """``state`` with the jobs of other queues that ``queue``'s live workers hold (a worker serving several
        queues runs one job whatever its queue), and those queues' use and quotas."""
        own = {job.job_id for job in state.running}
        foreign = sorted(job_id for job_id in placement.worker_of if job_id not in own)
        if not foreign:
            return state
        pipe = self.redis.pipeline(transaction=False)
        for job_id in foreign:
            pipe.hmget(keys.job(job_id), ["queue", "team", "slots", "priority", "state"])
        neighbours = []
        for job_id, (home, team, slots, priority, now) in zip(foreign, pipe.execute()):
            home = maybe_text(home) or "default"
            if maybe_text(now) != "running" or home == state.queue:
                continue
            neighbours.append(Running(job_id, maybe_text(team) or "default", max(1, _number(slots, 1)),
                                      _number(priority, 0), home))
        followers = self._followers([job.job_id for job in neighbours if job.slots > 1])
        live = placement.live | {placement.worker_of[job.job_id] for job in neighbours}
        neighbours = [replace(job, here=1 + len(followers.get(job.job_id, set()) & live)) if job.slots > 1
                      else replace(job, here=1) for job in neighbours]
        elsewhere = {home: (self.pool.usage(home), self.pool.quotas_of(home)) for home in {j.queue for j in neighbours}}
        return replace(state, neighbours=neighbours, elsewhere=elsewhere)

    def withdraw_stale(self, queue: str) -> list[str]:
        """Withdraw the marks of ``queue`` whose job they were for no longer waits, where the marked job's
        worker has not read them yet (it then trains on, and the next turn decides afresh); the jobs
        withdrawn. One command while nothing is marked."""
        marked = [text(job_id) for job_id in self.redis.hkeys(keys.queue_yielding(queue))]
        if not marked:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for job_id in marked:
            pipe.hget(keys.job(job_id), "yield_for")
        withdrawn = []
        for job_id, for_job in zip(marked, pipe.execute()):
            for_job = maybe_text(for_job)
            if for_job and self._withdraw(keys=[keys.job(job_id), keys.queue_yielding(queue), keys.job(for_job),
                                                keys.queue_cooling(queue)], args=[job_id, for_job]):
                _log.warning("job %s: its yield withdrawn: job %s no longer waits", job_id, for_job)
                withdrawn.append(job_id)
        return withdrawn

    def _cooling(self, queue: str, state: QueueState) -> frozenset[str]:
        """The jobs of ``queue`` and of its neighbours' queues asked to yield within ``YIELD_COOLDOWN_S``
        (``_MARK`` would refuse them), from each queue's cooling index (older entries are dropped): one
        script a queue, however many run."""
        found: set[str] = set()
        for name in {queue, *(job.queue for job in state.neighbours)}:
            found |= set(map(text, self._cooling_now(keys=[keys.queue_cooling(name)], args=[YIELD_COOLDOWN_S])))
        return frozenset(found)

    def _followers(self, gang_jobs: list[str]) -> dict[str, set[str]]:
        """The workers running the other nodes of each of ``gang_jobs`` (BUSY names only a gang's leader)."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in gang_jobs:
            pipe.hgetall(keys.gang(job_id))
        return {job_id: {text(worker) for field, worker in gang.items()
                         if text(field).startswith("worker:") and text(field) != "worker:0"}
                for job_id, gang in zip(gang_jobs, pipe.execute() if gang_jobs else [])}

    def placement(self, queue: str, waiting: list[Waiting], followers: frozenset[str] = frozenset()) -> Placement:
        """Where ``queue``'s ``waiting`` jobs can go (``refusals.place``), ``followers`` (a gang's other nodes,
        which BUSY does not name) not idle."""
        return refusals.place(self.redis, queue, waiting).without(followers)


def _number(value: object, default: int) -> int:
    try:
        return int(float(text(value))) if value is not None else default
    except ValueError:
        return default
