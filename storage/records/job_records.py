"""Job records in Redis, and every change to them as one atomic script.

A record is a hash (``keys.job``). Its ``attempt`` counts the claims by workers: each claim
starts a new attempt, and a worker's lease holds ``<attempt>:<worker>``. Every write a worker
makes is fenced: it succeeds only while that exact lease is alive, so a worker that paused
past its lease, or a stale redelivery, changes nothing.

Publishing a Celery message cannot be part of a Redis transaction, so it follows the outbox
pattern: a script marks the record ``publish_pending`` in the same step as the state change,
the message is published, then the mark is cleared and ``published_at`` set. The reaper
re-publishes a mark left behind by a crash, and a message published but not claimed in time
(a worker that took it died before its claim: kombu would redeliver it only after its
visibility_timeout); the duplicate messages this may create are dropped when claimed.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import redis

from baton.schemas.errors import JobNotFound
from baton.schemas.hosting import JobNeeds
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState, JobStatus

from baton.storage.records import keys, names, refusals
from baton.storage.records.connection import maybe_text, text, texts
from baton.storage.records.pool import LUA, Pool, QueueState, starts_in, why_waiting

_CREATE = LUA + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
job_event(KEYS[1], redis.call('HGET', KEYS[1], 'created_at'), 'submitted', 'queued', '')
pool_wait(KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""

# KEYS: job, index, active. ARGV: job id, score, unfinished (1/0), field/value pairs...
_RESTORE = LUA + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
if ARGV[3] == '1' then
  redis.call('SADD', KEYS[3], ARGV[1])
  pool_wait(KEYS[1], ARGV[1])
end
return 1
"""

# KEYS: job. ARGV: the mark, now. The message is out: from now on the reaper waits for its claim.
_CLEAR_PENDING = """
if redis.call('HGET', KEYS[1], 'publish_pending') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'publish_pending')
  redis.call('HSET', KEYS[1], 'published_at', ARGV[2])
end
return 1
"""

# KEYS: job. ARGV: the message's attempt, when it will be published again, now, event. A worker that
# cannot host the job passes its message on unclaimed: the record says why, and the reaper counts the
# wait for a claim from the coming publish (it must not publish a second copy meanwhile).
_PASS_ON = """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'retrying' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1 ~= tonumber(ARGV[1]) then return 0 end
if redis.call('HEXISTS', KEYS[1], 'publish_pending') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'published_at', ARGV[2], 'updated_at', ARGV[3], 'last_event', ARGV[4])
redis.call('HDEL', KEYS[1], 'republished')
return 1
"""

# KEYS: job, lease. ARGV: lease token, attempt, field/value pairs...
_FENCED_SET = """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
if #ARGV > 2 then redis.call('HSET', KEYS[1], unpack(ARGV, 3)) end
return 1
"""

# KEYS: job, lease, active. ARGV: lease token, job id, state, now, field/value pairs...
_FINISH = LUA + """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
pool_left(KEYS[1], ARGV[2])
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'updated_at', ARGV[4], 'finished_at', ARGV[4])
if #ARGV > 4 then redis.call('HSET', KEYS[1], unpack(ARGV, 5)) end
job_event(KEYS[1], ARGV[4], ARGV[3], ARGV[3] == 'failed' and (redis.call('HGET', KEYS[1], 'error') or '') or '')
redis.call('DEL', KEYS[1] .. ':live')
redis.call('HDEL', KEYS[1], 'cancel_requested')
redis.call('SREM', KEYS[3], ARGV[2])
return 1
"""

# KEYS: job, lease, active. ARGV: lease token, now, reason, job id, yielded ('1': it yielded its worker, and
# waits as "queued (yielded)"). Returns the next attempt, -1 if fenced out, or -2 when a cancel was asked for
# meanwhile (the job stopped at a checkpoint: it ends cancelled).
_RELEASE = LUA + """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[2])
if cancel_if_asked(KEYS[1], ARGV[4], ARGV[2], 'stopped (' .. ARGV[3] .. ')') then return -2 end
if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'yielded', '1') end
redis.call('HSET', KEYS[1], 'state', 'retrying', 'updated_at', ARGV[2], 'publish_pending', ARGV[2], 'last_event', ARGV[3])
job_event(KEYS[1], ARGV[2], 'yielded', ARGV[3])
pool_left(KEYS[1], ARGV[4])
pool_wait(KEYS[1], ARGV[4])
return tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1
"""

# KEYS: job, lease. ARGV: lease token, attempt, worker, now, reason, job id. Returns the next attempt, -1, or
# -2 when a cancel was asked for meanwhile (it ends cancelled).
# The lease is still this token's, or it lapsed and nobody has touched the job since (still running
# as this worker's attempt): either way the job is still this attempt's to give back, uncounted.
_RELEASE_IF_STILL_MINE = LUA + """
local lease = redis.call('GET', KEYS[2])
if lease ~= ARGV[1] then
  if lease then return -1 end
  if redis.call('HGET', KEYS[1], 'state') ~= 'running' then return -1 end
  if tonumber(redis.call('HGET', KEYS[1], 'attempt')) ~= tonumber(ARGV[2]) then return -1 end
  if redis.call('HGET', KEYS[1], 'worker') ~= ARGV[3] then return -1 end
end
redis.call('DEL', KEYS[2])
if cancel_if_asked(KEYS[1], ARGV[6], ARGV[4], 'stopped (' .. ARGV[5] .. ')') then return -2 end
redis.call('HSET', KEYS[1], 'state', 'retrying', 'updated_at', ARGV[4], 'publish_pending', ARGV[4], 'last_event', ARGV[5])
job_event(KEYS[1], ARGV[4], 'yielded', ARGV[5])
pool_left(KEYS[1], ARGV[6])
pool_wait(KEYS[1], ARGV[6])
return tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1
"""

# KEYS: job, lease, active. ARGV: lease token, now, reason, job id, stacks. Returns the next attempt,
# 0 when this loss was the last retry.max_attempts allows (the job failed), -1 if fenced out, -2 when a
# cancel was asked for meanwhile (the job ends cancelled: the loss is not counted).
_RELEASE_LOST = LUA + """
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'stall_stacks', ARGV[5])
job_event(KEYS[1], ARGV[2], 'lost', ARGV[3])
if cancel_if_asked(KEYS[1], ARGV[4], ARGV[2], 'lost its attempt (' .. ARGV[3] .. ')') then return -2 end
pool_left(KEYS[1], ARGV[4])
local lost = redis.call('HINCRBY', KEYS[1], 'lost', 1)
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2], 'last_event', ARGV[3])
if lost >= tonumber(redis.call('HGET', KEYS[1], 'max_attempts')) then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'finished_at', ARGV[2], 'traceback', ARGV[5],
             'error', ARGV[3] .. '; lost ' .. lost .. ' time(s), retry.max_attempts reached')
  job_event(KEYS[1], ARGV[2], 'failed', 'retry.max_attempts reached')
  redis.call('DEL', KEYS[1] .. ':live')
  redis.call('SREM', KEYS[3], ARGV[4])
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'retrying', 'publish_pending', ARGV[2])
pool_wait(KEYS[1], ARGV[4])
return tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1
"""

# KEYS: job, active. ARGV: job id, now
_CANCEL = LUA + """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 'missing' end
if state == 'queued' or state == 'retrying' or state == 'paused' then
  pool_unwait(KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[1], 'state', 'cancelled', 'updated_at', ARGV[2], 'finished_at', ARGV[2])
  job_event(KEYS[1], ARGV[2], 'cancelled', 'cancelled while ' .. (state == 'paused' and 'paused' or 'waiting'), '')
  redis.call('DEL', KEYS[1] .. ':live')
  redis.call('HDEL', KEYS[1], 'publish_pending')
  redis.call('SREM', KEYS[2], ARGV[1])
  return 'cancelled'
end
if state == 'running' then
  if not redis.call('HGET', KEYS[1], 'cancel_requested') then
    job_event(KEYS[1], ARGV[2], 'cancel requested', 'it stops at its next step', '')
  end
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
  return 'requested'
end
return state
"""

# KEYS: job, active. ARGV: job id, now. Returns the next attempt, or -1 when not resumable.
_RESUME = LUA + """
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'cancelled' and state ~= 'failed' then return -1 end
redis.call('HSET', KEYS[1], 'state', 'retrying', 'lost', '0', 'updated_at', ARGV[2], 'publish_pending', ARGV[2],
           'last_event', 'resumed by the user')
job_event(KEYS[1], ARGV[2], 'requeued', 'resumed by the user', '')
redis.call('HDEL', KEYS[1], 'error', 'traceback', 'failure', 'cancel_requested', 'finished_at', 'pause_at')
redis.call('SADD', KEYS[2], ARGV[1])
pool_wait(KEYS[1], ARGV[1])
return tonumber(redis.call('HGET', KEYS[1], 'attempt')) + 1
"""


def now() -> str:
    return repr(time.time())


def spec_fields(spec: JobSpec, storage_url: str) -> dict[str, str]:
    """The record fields a job's spec decides (at submit, and again when a lost record is recovered)."""
    resources = spec.resources
    return {"name": spec.name, "spec": spec.model_dump_json(), "queue": resources.queue, "team": resources.team,
            "priority": str(resources.priority), "slots": str(resources.nodes),
            "max_attempts": str(spec.retry.max_attempts), "storage_url": storage_url, "monitor": spec.checkpoint.monitor,
            "needs": JobNeeds.of(spec).model_dump_json(),
            **({"epochs": str(spec.loop.epochs)} if spec.loop.epochs is not None else {})}


CANCELLED_AS_IT_STOPPED = -2
"""What a release of a running attempt answers when a cancel asked for meanwhile ended the job instead."""

UNSERVED_AFTER_S = 10.0
"""How long a job waits before its status says that no live worker serves its queue."""


class JobRecords:
    """Reads and writes of job records. Worker-side writes take the lease token they hold."""

    def __init__(self, client: redis.Redis):
        self.redis = client
        self._create = client.register_script(_CREATE)
        self._restore = client.register_script(_RESTORE)
        self._clear_pending = client.register_script(_CLEAR_PENDING)
        self._fenced_set = client.register_script(_FENCED_SET)
        self._pass_on = client.register_script(_PASS_ON)
        self._finish = client.register_script(_FINISH)
        self._release = client.register_script(_RELEASE)
        self._release_lost = client.register_script(_RELEASE_LOST)
        self._release_if_still_mine = client.register_script(_RELEASE_IF_STILL_MINE)
        self._cancel = client.register_script(_CANCEL)
        self._resume = client.register_script(_RESUME)
        self.pool = Pool(client)

    # --- client side -----------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, str]) -> bool:
        """Store a new queued record (marked publish_pending); False if the id is taken."""
        stamp = now()
        record = {**fields, "id": job_id, "state": JobState.queued.value, "attempt": "0", "lost": "0",
                  "created_at": stamp, "updated_at": stamp, "publish_pending": stamp}
        flat = [item for pair in record.items() for item in pair]
        created = bool(self._create(keys=[keys.job(job_id), keys.JOBS_INDEX, keys.ACTIVE], args=[job_id, stamp, *flat]))
        if created:
            names.note(self.redis, fields)
        return created


    def restore(self, job_id: str, fields: dict[str, str], state: JobState, attempt: int) -> bool:
        """Re-create a record lost with Redis (``baton.jobs.recover``): ``state`` at ``attempt`` claims so far;
        an unfinished one is marked publish_pending for its next attempt. False if the id has a record."""
        stamp = now()
        record = {**fields, "id": job_id, "state": state.value, "attempt": str(attempt), "lost": "0",
                  "created_at": stamp, "updated_at": stamp}
        unfinished = not state.terminal
        if unfinished:
            record["publish_pending"] = stamp
        else:
            record["finished_at"] = stamp
        flat = [str(item) for pair in record.items() for item in pair]
        restored = bool(self._restore(keys=[keys.job(job_id), keys.JOBS_INDEX, keys.ACTIVE],
                                      args=[job_id, stamp, "1" if unfinished else "0", *flat]))
        if restored:
            names.note(self.redis, fields)
        return restored

    def published(self, job_id: str, mark: str) -> None:
        """The message for ``mark`` (the publish_pending value) is out: clear the mark."""
        self._clear_pending(keys=[keys.job(job_id)], args=[mark, now()])

    def pending_mark(self, job_id: str) -> Optional[str]:
        return maybe_text(self.redis.hget(keys.job(job_id), "publish_pending"))

    def publish_marked(self, job_id: str, attempt: int, send: Callable[[str, int, str], None]) -> None:
        """The outbox's second half: send ``(job id, attempt, queue)``, then clear the mark the state
        change left. A crash before the clear leaves the mark for the reaper to publish again."""
        mark, queue = self.redis.hmget(keys.job(job_id), ["publish_pending", "queue"])
        send(job_id, attempt, maybe_text(queue) or "default")
        if mark:
            self.published(job_id, text(mark))

    def exists(self, job_id: str) -> bool:
        return bool(self.redis.exists(keys.job(job_id)))

    def state(self, job_id: str) -> Optional[JobState]:
        """The job's state (None: no such job)."""
        found = maybe_text(self.redis.hget(keys.job(job_id), "state"))
        return JobState(found) if found else None

    def raw(self, job_id: str) -> dict[str, str]:
        record = self.redis.hgetall(keys.job(job_id))
        if not record:
            raise JobNotFound(f"no job {job_id!r}")
        return texts(record)

    def status(self, job_id: str, queues: Optional[dict[str, QueueState]] = None) -> JobStatus:
        """The job's status; a waiting one's place in its queue's start order worked out now (``queues``:
        the queues' states read so far, kept for the next status of a listing)."""
        status = JobStatus.model_validate(self.raw(job_id))
        if status.state in (JobState.queued, JobState.retrying):
            queues = {} if queues is None else queues
            if status.queue not in queues:
                queues[status.queue] = self.pool.state(status.queue)
            self._place(status, queues[status.queue])
        return status

    def _place(self, status: JobStatus, state: QueueState) -> None:
        """A waiting job's position, why it waits and when it may start. A queue that no live worker serves
        says so once the job has waited ``UNSERVED_AFTER_S`` (a worker may be starting), nothing before;
        one whose live workers cannot host the job says what none of them offers."""
        seconds, micros = self.redis.time()
        now = seconds + micros / 1e6
        waiting = state.find(status.id)
        status.position = waiting.position if waiting is not None else None
        ahead = state.waiting[:waiting.position][-refusals.HEADS:] if waiting is not None else []  # (it, last)
        placement = refusals.place(self.redis, status.queue, ahead[::-1])
        if not placement.served:
            if status.updated_at is None or now - status.updated_at >= UNSERVED_AFTER_S:
                status.waiting = (f"no live worker serves queue {status.queue!r}: start one with `baton worker "
                                  f"--queues {status.queue}` (with the same BATON_REDIS_URL)")
            return
        if waiting is not None:
            unmet = refusals.unmet_reason(placement, status.queue, status.id, status.last_event)
            status.waiting = unmet or why_waiting(state, waiting, placement)
            if status.waiting.endswith("within moments") and (status.last_event or "").startswith("waiting for"):
                status.waiting = status.last_event  # a worker passed it on, saying why: more than its place in line
            if unmet is None:  # (a job nothing can host has no start to estimate)
                status.starts_in_s = starts_in(state, waiting, self.pool.remaining_s(state))

    def list_ids(self, limit: int = 100) -> list[str]:
        """Newest first."""
        return [text(job_id) for job_id in self.redis.zrevrange(keys.JOBS_INDEX, 0, limit - 1)]

    def add_to_sweep(self, sweep_id: str, job_ids: list[str]) -> None:
        """Index a sweep's jobs (before their records exist: a listing skips ids without one)."""
        self.redis.zadd(keys.sweep(sweep_id), {job_id: i for i, job_id in enumerate(job_ids)})

    def sweep_taken(self, sweep_id: str) -> bool:
        """Whether a sweep or a search already has this id (their jobs share one index)."""
        return bool(self.redis.exists(keys.sweep(sweep_id), keys.search(sweep_id)))

    def sweep_ids(self, sweep_id: str) -> list[str]:
        """A sweep's job ids in grid order; empty for an unknown sweep."""
        return [text(job_id) for job_id in self.redis.zrange(keys.sweep(sweep_id), 0, -1)]

    def cancel(self, job_id: str) -> str:
        """'cancelled' (it was waiting), 'requested' (its worker stops at the next step), 'missing',
        or its terminal state."""
        return self._cancel(keys=[keys.job(job_id), keys.ACTIVE], args=[job_id, now()])

    def resume(self, job_id: str) -> int:
        """Make a cancelled or failed job runnable again; returns the attempt to publish, -1 if not resumable."""
        return int(self._resume(keys=[keys.job(job_id), keys.ACTIVE], args=[job_id, now()]))

    # --- worker side (fenced by the lease token) ---------------------------------------------
    def pass_on(self, job_id: str, attempt: int, event: str, publish_in_s: float) -> bool:
        """Record that the message for ``attempt`` is handed back unclaimed, ``publish_in_s`` from
        now, by a worker that cannot host the job (``event`` says why); False if the message is
        stale (the job moved on), in which case it is dropped, not published again."""
        return bool(self._pass_on(keys=[keys.job(job_id)],
                                  args=[attempt, repr(time.time() + publish_in_s), now(), event]))

    def holds(self, job_id: str, token: str) -> bool:
        """Whether ``token`` holds the job's lease now: one GET, read from Redis (the checkpoint fence)."""
        return maybe_text(self.redis.get(keys.lease(job_id))) == token

    def fenced_set(self, job_id: str, token: str, fields: dict[str, object]) -> bool:
        """Set ``fields`` while ``token`` still holds the lease; False when fenced out."""
        flat = [str(item) for pair in fields.items() for item in pair]
        return bool(self._fenced_set(keys=[keys.job(job_id), keys.lease(job_id)], args=[token, "", *flat]))

    def finish(self, job_id: str, token: str, state: JobState, fields: Optional[dict[str, object]] = None) -> bool:
        flat = [str(item) for pair in (fields or {}).items() for item in pair]
        return bool(self._finish(keys=[keys.job(job_id), keys.lease(job_id), keys.ACTIVE],
                                 args=[token, job_id, state.value, now(), *flat]))

    def release(self, job_id: str, token: str, reason: str, yielded: bool = True) -> int:
        """Give the job back for another worker at once, uncounted; ``yielded``: it yielded its worker (a
        preemption, a drain, a higher priority: it waits as "queued (yielded)"), else the infrastructure failed
        it (its store away). Returns the next attempt, -1 if fenced, -2 if a cancel ended it instead."""
        return int(self._release(keys=[keys.job(job_id), keys.lease(job_id), keys.ACTIVE],
                                 args=[token, now(), reason, job_id, "1" if yielded else "0"]))

    def release_if_still_mine(self, job_id: str, token: str, attempt: int, worker: str, reason: str) -> int:
        """After Redis was unreachable: give the job back, not counted as a loss, if ``token`` still
        holds its lease or the lease lapsed with the job untouched since (still ``attempt``, running on
        ``worker``). Returns the next attempt, -1 when another attempt or a reaper has moved it on, -2
        when a cancel asked for meanwhile ended it."""
        return int(self._release_if_still_mine(keys=[keys.job(job_id), keys.lease(job_id)],
                                               args=[token, attempt, worker, now(), reason, job_id]))

    def release_lost(self, job_id: str, token: str, reason: str, stacks: str) -> int:
        """Give the job back as a worker loss (a hung attempt): counted against retry.max_attempts.
        Returns the next attempt, 0 when the job failed instead, -1 if fenced out, -2 when a cancel asked
        for meanwhile ended it (not counted)."""
        return int(self._release_lost(keys=[keys.job(job_id), keys.lease(job_id), keys.ACTIVE],
                                      args=[token, now(), reason, job_id, stacks]))
