"""What a worker does with a message before it claims an attempt: choose the job (``choices``: the first
waiting jobs of the queue's start order), read its record, once (``read_job``), decide whether it can host
it (``cannot_host``), else hand the message back for another worker (``pass_on``; a drained worker
hands back every message and holds until undrained: ``hold_drained``); and the outbox's publish of a
job's next attempt (``publish``)."""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import redis
from kombu.exceptions import KombuError

from baton.schemas.errors import SpecError
from baton.schemas.hosting import JobNeeds, lacking
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.storage.records import keys, presence, refusals
from baton.storage.records.connection import maybe_text
from baton.storage.records.gangs import Gangs
from baton.storage.records.pool import Pool, Waiting, merged_order
from baton.workers.queue.worker_control import WorkerContext
from baton.workers.training.installed import unavailable

_log = logging.getLogger("baton.worker")

CHOICES = 16
"""How many of a queue's first waiting jobs a worker considers when it takes a message: it starts the
first it can host (a job for GPUs this worker does not offer, or modules it may not import, is left to
its own message, which another worker takes)."""
PASS_ON_WAIT_S = 10.0
"""How long the message of a job a worker cannot host is held before it goes back to the queue: by this
worker, when another live worker may host it (that one, not this one at once, takes it next); else aside,
while this worker takes its next message (a job nobody can host holds up none)."""


@dataclass(frozen=True)
class JobView:
    """What a delivery reads of the job's record, once, before its claim: the spec (validated here; a
    spec that does not validate fails the job at its claim), the store, the queue, and where it pauses
    (``pause_at``: a search's rung)."""

    spec: Optional[JobSpec]
    spec_error: Optional[SpecError]
    storage_url: Optional[str]
    queue: str
    pause_at: Optional[int] = None

    @property
    def nodes(self) -> int:
        return self.spec.resources.nodes if self.spec is not None else 1


def read_job(ctx: WorkerContext, job_id: str) -> Optional[JobView]:
    """The job's record as a delivery needs it; None when Redis cannot be read (claiming then could run
    a multi-node job on one node). A missing job reads as no spec: its claim drops the message."""
    try:
        raw, storage_url, queue, pause_at = ctx.redis.hmget(keys.job(job_id), ["spec", "storage_url", "queue",
                                                                              "pause_at"])
    except redis.RedisError:
        return None
    spec, error = None, None
    if raw:
        try:
            spec = JobSpec.parse(json.loads(raw))
        except ValueError:
            error = SpecError([f"spec: the job's record holds no readable spec (on worker {ctx.worker})"])
        except SpecError as exc:
            error = exc
    return JobView(spec, error, maybe_text(storage_url), maybe_text(queue) or "default",
                   int(pause_at) if pause_at else None)


@dataclass(frozen=True)
class Choice:
    """A waiting job a worker may start: the attempt a claim would start, and its record as read."""

    job_id: str
    attempt: int
    view: JobView


@dataclass(frozen=True)
class Passed:
    """No waiting job can start here: the one whose message to pass on (the message's own job if it waits,
    else the first this worker cannot host: every waiting job keeps a message out), why, and the event its
    record shows (None: the default)."""

    job_id: str
    attempt: int
    why: str
    event: Optional[str] = None


def choices(ctx: WorkerContext, queue: str, job_id: str, attempt: int) -> Iterator["Choice | Passed"]:
    """The jobs a message of ``job_id`` (of ``queue``) may start on this worker, best first: the first waiting
    jobs of every queue this worker serves that it can host (``start_order``), then the message's own job if
    it was not among them. Then, if some waiting job could not start here (this worker cannot host it, or
    it is a multi-node job that must wait for another job's gang to form on its queue), one ``Passed``:
    the message goes back for another worker. If the queues' order cannot be read (Redis away), only the
    message's own job."""
    try:
        first = start_order(ctx, queue)
        gangs = Gangs(ctx.redis)
        forming: Optional[dict[str, Optional[str]]] = {name: gangs.busy_with(name) for name in served(ctx, queue)}
    except redis.RedisError:
        first, forming = [], None
    passed: Optional[Passed] = None
    seen = False
    waiting = {w.job_id for w in first}
    for job, next_attempt in [(w.job_id, w.attempt) for w in first] + [(job_id, attempt)]:
        if job == job_id:
            if seen:
                break
            seen = True
        view = read_job(ctx, job)
        if view is None:
            continue
        why = refusal(ctx, job, view)
        handed = attempt if job == job_id else next_attempt  # (a stale copy of a message is dropped, not passed on)
        here = None if why is None else Passed(job, handed, why)
        gang = forming.get(view.queue) if forming is not None else None
        if why is None and view.nodes > 1 and forming is not None and gang not in (None, job):
            event = f"waiting for nodes: the gang of {gang} is forming on queue {view.queue} first"
            here = Passed(job, handed, event, event)
        if here is None:
            yield Choice(job, next_attempt, view)
        elif passed is None or (job == job_id and job in waiting):  # (the message's own job, if it waits, first)
            passed = here
    if passed is not None:
        yield passed


def served(ctx: WorkerContext, queue: str) -> list[str]:
    """The queues this worker serves, the message's ``queue`` first."""
    return [queue, *(name for name in ctx.queues if name != queue)]


def start_order(ctx: WorkerContext, queue: str) -> list[Waiting]:
    """The first ``CHOICES`` waiting jobs of every queue this worker serves, in the order it starts them:
    by priority across its queues (a worker's slot is one slot, whatever queue it serves), then by how far
    each job's team is below its quota on the job's own queue, then by submit time (``merged_order``)."""
    pool = Pool(ctx.redis)
    states = [pool.state(name, limit=CHOICES) for name in served(ctx, queue)]
    if len(states) == 1:
        return states[0].waiting[:CHOICES]
    return merged_order(states)[:CHOICES]


def cannot_host(ctx: WorkerContext, job_id: str, view: JobView) -> Optional[str]:
    """Why this worker cannot give the job what it needs (what it offers every job: GPUs for each of its
    ranks, modules its BATON_ALLOWED_MODULES allows, running shipped code (BATON_ACCEPT_CODE); then what it
    looks up: packages installed here, unless the job ships its code; a store it has probed, holding the
    job's spec: job_store.py); None if it can, or if the record cannot tell (the claim then decides, as
    for any job)."""
    if view.spec is None:
        return None  # no spec, or one that does not validate: the claim drops it, or fails it naming what is wrong
    lacks = lacking(JobNeeds.of(view.spec), ctx.offer)  # (what it announced it offers: the scheduler knows it too)
    why = lacks.why if lacks is not None else None
    if why is None and not ships_code(view.spec):  # (looked up here: a package installed on this worker)
        why = unavailable(view.spec.user_targets(), ctx.settings.allowed_prefixes)
    if why is None and view.storage_url:
        why = ctx.stores.refusal(job_id, view.storage_url)
    return None if why is None else f"{why} on {ctx.worker}"


def refusal(ctx: WorkerContext, job_id: str, view: JobView) -> Optional[str]:
    """``cannot_host``, told to the scheduler when this worker cannot (``refusals``: it frees no worker
    here for the job; Redis away, it is not told, and may free this worker for it once more)."""
    why = cannot_host(ctx, job_id, view)
    try:
        if why is not None:
            refusals.note(ctx.redis, job_id, ctx.worker, ctx.run)
        else:  # (a worker restarted under its name with more GPUs, say, takes back its "no")
            refusals.withdraw(ctx.redis, job_id, ctx.worker)
    except redis.RedisError as exc:
        _log.warning("job %s: could not tell the scheduler whether this worker can host it (%s: %s)", job_id,
                     type(exc).__name__, exc)
    return why


def ships_code(spec: JobSpec) -> bool:
    return spec.code is not None and spec.code.ships


def pass_on(ctx: WorkerContext, job_id: str, attempt: int, why: str, event: Optional[str] = None,
            wait_s: float = PASS_ON_WAIT_S) -> str:
    """Hand the message back unclaimed (no attempt used, nothing counted), the record saying why, after
    ``wait_s`` (none: this worker will not take it meanwhile, being drained)."""
    event = event or f"waiting for a worker that can host it: {ctx.worker} passed it on: {why}"
    _log.warning("job %s attempt %d: not claimed: %s; passed on in %.0fs", job_id, attempt, why, wait_s)
    try:  # the record first: the reaper then waits for this publish instead of adding a copy meanwhile
        if not ctx.records.pass_on(job_id, attempt, event, wait_s):
            return "dropped"
        queue = maybe_text(ctx.redis.hget(keys.job(job_id), "queue")) or "default"
    except redis.RedisError as exc:  # not passed on: the reaper publishes it again later
        _log.warning("job %s attempt %d: not passed on yet (%s: %s); a reaper will publish it", job_id, attempt,
                     type(exc).__name__, exc)
        return "passed on"
    if wait_s <= 0:
        _publish_passed(ctx, job_id, attempt, queue)
    elif _others_may_host(ctx, job_id, queue):  # held here meanwhile: the next to take it is another worker
        time.sleep(wait_s)
        _publish_passed(ctx, job_id, attempt, queue)
    else:  # nobody can: held aside, not by this worker, which takes its next message now (another job's)
        timer = threading.Timer(wait_s, _publish_passed, (ctx, job_id, attempt, queue))
        timer.daemon = True
        timer.start()
    return "passed on"


def _others_may_host(ctx: WorkerContext, job_id: str, queue: str) -> bool:
    """Whether a live worker of ``queue`` other than this one may host the job (by what it offers, and what it
    said); Redis away: yes (the message is held here, as before)."""
    try:
        needs = maybe_text(ctx.redis.hget(keys.job(job_id), "needs")) or ""
        placement = refusals.place(ctx.redis, queue, [Waiting(job_id, job_id, "", 0, 0.0, 0, 1, needs=needs)])
    except redis.RedisError:
        return True
    return bool(placement.live - {ctx.worker} - placement.refused.get(job_id, frozenset()))


def _publish_passed(ctx: WorkerContext, job_id: str, attempt: int, queue: str) -> None:
    try:
        ctx.publish(job_id, attempt, queue)
    except (KombuError, OSError, redis.RedisError) as exc:  # not published: the reaper publishes it again later
        _log.warning("job %s attempt %d: not passed on yet (%s: %s); a reaper will publish it", job_id, attempt,
                     type(exc).__name__, exc)


def hand_back(ctx: WorkerContext, job_id: str, attempt: int, queue: str) -> None:
    """This worker starts a job of another queue than the message's: the message goes back to ``queue``
    at once (a message stands for a job waiting there; without it, such a job would wait for the reaper's
    re-publish). A copy it turns out not to need is dropped when claimed, as every duplicate is; the message
    of a job that no longer waits goes nowhere."""
    try:
        if ctx.records.state(job_id) not in (JobState.queued, JobState.retrying):
            return
        ctx.publish(job_id, attempt, queue)
    except (redis.RedisError, KombuError, OSError) as exc:  # (a reaper publishes a job whose message went missing)
        _log.warning("job %s attempt %d: message not handed back to queue %s (%s: %s)", job_id, attempt, queue,
                     type(exc).__name__, exc)


def publish(ctx: WorkerContext, job_id: str, attempt: int) -> None:
    """The outbox's publish; if the broker is away the mark stays and the reaper publishes it later."""
    try:
        ctx.records.publish_marked(job_id, attempt, ctx.publish)
    except (redis.RedisError, KombuError, OSError) as exc:
        _log.warning("job %s: attempt %d not published yet (%s: %s); a reaper will publish it", job_id, attempt,
                     type(exc).__name__, exc)


def drained(ctx: WorkerContext) -> bool:
    """Whether this worker is drained (``baton drain``); when Redis cannot say, it is not (the claim that
    follows waits for Redis as every claim does)."""
    try:
        return bool(presence.drained(ctx.redis, [ctx.worker]))
    except redis.RedisError:
        return False


def hold_drained(ctx: WorkerContext, job_id: str, attempt: int) -> str:
    """A drained worker's answer to a message: hand it straight back for another worker, then take no
    other while drained (a worker runs one message at a time: holding this one holds them all) or
    until it is told to shut down."""
    word = pass_on(ctx, job_id, attempt, "drained", f"waiting for a worker: {ctx.worker} is drained", wait_s=0)
    _log.warning("drained: taking no job until `baton undrain %s`", ctx.worker)
    while not ctx.preemption.requested.wait(DRAIN_POLL_S):
        try:
            if not presence.drained(ctx.redis, [ctx.worker]):
                _log.warning("undrained: taking jobs again")
                break
        except redis.RedisError as exc:  # still drained, as far as this worker knows
            _log.warning("could not read whether this worker is still drained (%s: %s)", type(exc).__name__, exc)
    return word


DRAIN_POLL_S = 1.0
"""How often a drained worker reads whether it was undrained."""
