"""One delivery of a job to a worker: claim, train under a lease, record how it ended.

How an attempt ends decides what happens to the job:
- finished: succeeded; cancelled (at a step boundary, after a checkpoint): cancelled;
- preempted (SIGTERM): checkpointed, then released and re-queued at once as the next attempt;
- an exception from the job's own model or data code: failed, with its traceback, not retried;
- storage unreachable beyond its retries: released and re-queued (infrastructure, not the job);
- fenced out (another attempt owns the job): nothing more is written;
- hung (no optimizer step for BATON_STALL_TIMEOUT_S): released as a worker loss with every
  thread's stack in its status, and the worker process exits (``stall.py``).
A worker killed outright writes nothing; its lease expires and the reaper re-queues the job.

Redis going away (a restart, a failover) is none of these: every Redis call here is retried
while the lease may still be valid (``redis_retry.while_leased``); if Redis stays away longer,
the attempt stops as fenced out (``LeaseUnconfirmed``), committing nothing. When Redis answers
again, the job is released *if it is still this attempt's* (its lease, or a lease that lapsed
with the job untouched since), not counted as a loss; otherwise a reaper has re-queued it (also
uncounted, ``reaper.py``) or another attempt owns it (``claims.py``). Progress records are not
waited for: the next step writes newer ones.

Redis behind the store (``claims.py``): an attempt whose number the manifest has already passed
catches up past it before training, instead of being fenced out and lost.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Optional

import redis
from kombu.exceptions import KombuError

from baton.storage.records import keys
from baton.workers.training.failures import summary
from baton.schemas.errors import FencedOut, SpecError, TransientError, formatted_traceback
from baton.schemas.messages import AttemptEnd, AttemptOrder, Ending, Failure, PeersOrder
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.schemas.targets import disallowed_targets
from baton.storage.memory.memory_slots import JobMemory
from baton.storage.stores.open import open_store
from baton.workers.attempt.process import Death, TrainingProcess
from baton.workers.parallel.launcher import devices_missing
from baton.workers.parallel.nodes import ANNOUNCE, REMOTE_FAILURE
from baton.workers.tracking import prometheus
from baton.workers.training.targets import unavailable

from baton.workers.queue import gang_runner
from baton.storage.records import leases
from baton.workers.queue.heartbeat import Heartbeat
from baton.workers.queue.claims import catch_up_with_manifest, release_if_still_mine
from baton.workers.queue.redis_retry import while_leased
from baton.workers.queue.stall import StallWatchdog, exit_process
from baton.workers.queue.worker_control import WorkerContext, WorkerControl

_log = logging.getLogger("baton.worker")

def _release(ctx: WorkerContext, control: "WorkerControl", reason: str, kind: str = "preempted") -> None:
    """Give the job back for another worker now, as its next attempt."""
    job_id = control.job_id
    reason = ctx.redact(reason)
    next_attempt = control.leased(lambda: ctx.records.release(job_id, control.token, reason), "the release")
    if next_attempt < 0:
        return  # fenced out already: someone else owns it
    prometheus.JOBS_RETRIED.labels(kind).inc()
    _publish(ctx, job_id, next_attempt)
    _log.warning("job %s: released (%s), queued as attempt %d", job_id, reason, next_attempt)


def _stalled(ctx: WorkerContext, control: "WorkerControl", idle_s: float, own_stacks: str) -> None:
    """The stall watchdog fired: the training process's stacks recorded, it and everything below it
    killed, the job given back as a worker loss. A worker hung itself before its training process
    started (``own_stacks``: its threads') hands the job back and leaves."""
    job_id, process = control.job_id, control.process
    if process is not None and process.reported_end:
        return  # it said how its attempt ended meanwhile: that is recorded instead
    reason = f"no optimizer step for {idle_s:.0f}s on {ctx.worker} (BATON_STALL_TIMEOUT_S); stopped as hung"
    stacks = ctx.redact(process.stacks() if process is not None else own_stacks)
    _log.error("job %s: %s; every thread's stack:\n%s", job_id, reason, stacks)
    if process is not None:
        process.kill("stalled")
    try:
        if not control.heartbeat.fenced.is_set():
            next_attempt = control.leased(lambda: ctx.records.release_lost(job_id, control.token, reason, stacks),
                                          "the release of a hung attempt")
            if next_attempt > 0:
                prometheus.JOBS_RETRIED.labels("stalled").inc()
                _publish(ctx, job_id, next_attempt)
    except (redis.RedisError, FencedOut) as exc:  # its lease expires once this attempt is gone: reaped instead
        _log.error("job %s: could not release the hung attempt (%s); its lease will expire", job_id, exc)
    if process is None:
        exit_process(f"job {job_id} hung; a fresh worker process must take over")


def _release_lost(ctx: WorkerContext, control: "WorkerControl", reason: str, metric_reason: str = "rank_lost") -> None:
    """Give the job back as a worker loss (counted against retry.max_attempts), for another worker now."""
    job_id = control.job_id
    reason = ctx.redact(reason)
    _log.error("job %s: %s; released as a worker loss", job_id, reason)
    next_attempt = control.leased(lambda: ctx.records.release_lost(job_id, control.token, reason, ""),
                                  "the release of a lost attempt")
    if next_attempt > 0:
        prometheus.JOBS_RETRIED.labels(metric_reason).inc()
        _publish(ctx, job_id, next_attempt)


def _publish(ctx: WorkerContext, job_id: str, attempt: int) -> None:
    """The outbox's publish; if the broker is away the mark stays and the reaper publishes it later."""
    try:
        ctx.records.publish_marked(job_id, attempt, ctx.publish)
    except (redis.RedisError, KombuError, OSError) as exc:
        _log.warning("job %s: attempt %d not published yet (%s: %s); a reaper will publish it", job_id, attempt,
                     type(exc).__name__, exc)


def _finish(control: "WorkerControl", state: JobState, fields: Optional[dict] = None) -> None:
    control.leased(lambda: control.ctx.records.finish(control.job_id, control.token, state, fields),
                   f"recording the job {state.value}")


PASS_ON_WAIT_S = 10.0
"""How long a worker that cannot host a job holds its message before handing it back to the queue
(so that the queue's other workers, not this one at once, take it next)."""


def _cannot_host(ctx: WorkerContext, job_id: str) -> Optional[str]:
    """Why this worker cannot give the job what it needs (GPUs for each of its ranks; its code: modules
    this worker's BATON_ALLOWED_MODULES allows, from packages installed here; a store it has probed,
    holding the job's spec: job_store.py); None if it can, or if the record cannot tell (the claim
    then decides, as for any job)."""
    try:
        raw, storage_url = ctx.redis.hmget(keys.job(job_id), ["spec", "storage_url"])
        data = json.loads(raw) if raw else None
        resources = data["resources"] if data else None
    except (redis.RedisError, ValueError, KeyError, TypeError):
        return None
    if not resources:
        return None
    missing = devices_missing(str(resources.get("device", "auto")), int(resources.get("processes", 1)),
                              ctx.offered_gpus())
    if missing is not None:
        return missing
    try:
        targets = JobSpec.parse(data).user_targets()
    except SpecError:
        return None  # the claim fails it, naming what is wrong
    why = unavailable(targets, ctx.settings.allowed_prefixes)
    if why is None and storage_url:
        why = ctx.stores.refusal(job_id, storage_url)
    return None if why is None else f"{why} on {ctx.worker}"


def _pass_on(ctx: WorkerContext, job_id: str, attempt: int, why: str, event: Optional[str] = None) -> str:
    """Hand the message back unclaimed (no attempt used, nothing counted), the record saying why."""
    event = event or f"waiting for a worker that can host it: {ctx.worker} passed it on: {why}"
    _log.warning("job %s attempt %d: not claimed: %s; passed on in %.0fs", job_id, attempt, why, PASS_ON_WAIT_S)
    try:  # the record first: the reaper then waits for this publish instead of adding a copy meanwhile
        if not ctx.records.pass_on(job_id, attempt, event, PASS_ON_WAIT_S):
            return "dropped"
        queue = ctx.redis.hget(keys.job(job_id), "queue") or "default"
        time.sleep(PASS_ON_WAIT_S)
        ctx.publish(job_id, attempt, queue)
    except (redis.RedisError, KombuError, OSError) as exc:  # not published: the reaper publishes it again later
        _log.warning("job %s attempt %d: not passed on yet (%s: %s); a reaper will publish it", job_id, attempt,
                     type(exc).__name__, exc)
    return "passed on"


def run_job(ctx: WorkerContext, job_id: str, attempt: int) -> str:
    """Run one delivered attempt; returns a word saying how it ended (for logs and tests). A job on
    several nodes is led from here: its gang forms first, then the attempt is claimed (``gang_runner``)."""
    cannot = _cannot_host(ctx, job_id)
    if cannot is not None:
        return _pass_on(ctx, job_id, attempt, cannot)
    nodes, queue = gang_runner.gang_size(ctx.redis, job_id)
    if nodes is None:  # the record cannot be read: claiming could run a multi-node job on one node
        return _pass_on(ctx, job_id, attempt, "its record could not be read")
    if nodes > 1:
        return gang_runner.lead(ctx, job_id, attempt, nodes, queue,
                                lambda event: _pass_on(ctx, job_id, attempt, event, event),
                                lambda leadership: _claim_and_run(ctx, job_id, attempt, leadership))
    return _claim_and_run(ctx, job_id, attempt)


def join_gang(ctx: WorkerContext, job_id: str, attempt: int, nodes: int) -> str:
    """A join message of a multi-node job: this worker becomes one of its nodes, if it can host one."""
    return gang_runner.follow(ctx, job_id, attempt, nodes, _cannot_host(ctx, job_id), PASS_ON_WAIT_S)


def _claim_and_run(ctx: WorkerContext, job_id: str, attempt: int, gang: Optional["gang_runner.Leadership"] = None) -> str:
    """Claim ``attempt`` and train it; when its training process dies, the next attempt is claimed
    and run here again (``_crashed``), resuming from what that process left in memory."""
    memory = JobMemory()
    comeback: Optional[Death] = None
    try:
        while True:
            outcome = _claim_and_run_once(ctx, job_id, attempt, gang, memory, comeback)
            if not isinstance(outcome, Comeback):
                return outcome
            attempt, comeback = outcome.attempt, outcome.death
    finally:
        memory.remove()


@dataclass(frozen=True)
class Comeback:
    """The training process died; the job's next attempt is this worker's to run at once."""

    attempt: int
    death: Death


def _claim_and_run_once(ctx: WorkerContext, job_id: str, attempt: int, gang: Optional["gang_runner.Leadership"],
                        memory: JobMemory, comeback: Optional[Death]) -> "str | Comeback":
    nonce = leases.new_nonce()
    try:  # no lease yet: wait for Redis one lease TTL, then leave the message to the reaper's re-publish
        wait_until = time.monotonic() + ctx.settings.lease_ttl_s
        claimed = while_leased(lambda: leases.claim(ctx.redis, job_id, attempt, ctx.worker, ctx.settings.lease_ttl_s,
                                                   nonce),
                               lambda: wait_until, f"job {job_id}: the claim")
    except FencedOut as exc:
        _log.warning("job %s attempt %d: dropped (%s)", job_id, attempt, exc)
        return "dropped"
    if not claimed.ok:
        _log.info("job %s attempt %d: dropped (%s)", job_id, attempt, claimed.reason)
        return "dropped"
    spec_data = json.loads(claimed.spec)
    heartbeat = Heartbeat(ctx.redis, job_id, claimed.token, ctx.worker, ctx.settings.lease_ttl_s,
                                ctx.settings.heartbeat_s, on_renew=prometheus.LEASE_RENEWALS.inc)
    heartbeat.start()
    prometheus.JOBS_STARTED.inc()
    prometheus.JOBS_RUNNING.inc()
    control = WorkerControl(ctx, job_id, heartbeat)
    control.comeback = comeback
    ctx.preemption.register(job_id, lambda why: _release(ctx, control, why))
    if ctx.settings.stall_timeout_s > 0:
        control.stall = StallWatchdog(job_id, ctx.settings.stall_timeout_s,
                                      lambda idle_s, stacks: _stalled(ctx, control, idle_s, stacks))
        control.stall.start()
    _log.info("job %s: attempt %d started on %s", job_id, attempt, ctx.worker)
    outcome = "error"
    try:
        try:
            ended = _train(ctx, job_id, attempt, nonce, spec_data, claimed.storage_url, control, gang, memory)
            outcome = "crashed" if isinstance(ended, Comeback) else ended
        except FencedOut as exc:  # Redis stayed away past the lease while the outcome was being recorded
            prometheus.FENCING_EVENTS.inc()
            _log.warning("job %s attempt %d: %s; its lease will bring it back", job_id, attempt, exc)
            ended = outcome = "fenced"
        if outcome == "fenced" and heartbeat.unreachable.is_set():
            heartbeat.stop()  # the lease is not renewed any more: the release below must find it as it is
            release_if_still_mine(control, leases.attempt_of(control.token), lambda n: _publish(ctx, job_id, n))
        return ended
    finally:
        prometheus.JOBS_RUNNING.dec()  # first: the job's record already says how it ended
        prometheus.JOBS_FINISHED.labels(outcome).inc()
        if control.stall is not None:
            control.stall.stop()
        heartbeat.stop()
        ctx.preemption.unregister(job_id)


def _train(ctx: WorkerContext, job_id: str, attempt: int, nonce: str, spec_data: dict, storage_url: str,
           control: WorkerControl, gang: Optional["gang_runner.Leadership"], memory: JobMemory) -> "str | Comeback":
    try:
        spec = JobSpec.parse(spec_data)
        problems = disallowed_targets(spec.user_targets(), ctx.settings.allowed_prefixes)
        if problems:
            raise SpecError([f"{p} (on worker {ctx.worker})" for p in problems])
        store = open_store(storage_url)
        attempt = catch_up_with_manifest(control, attempt, nonce, store)
    except FencedOut as exc:
        return _fenced(job_id, attempt, exc)
    except TransientError as exc:
        _release(ctx, control, f"storage unavailable on {ctx.worker}: {exc}", kind="storage")
        return "released"
    except Exception as exc:  # the job's spec: record it, do not retry
        return _failed(ctx, control, summary(exc, ctx.settings.allowed_prefixes), formatted_traceback(exc),
                       f"{type(exc).__name__}: {exc}")
    order = AttemptOrder(
        spec=spec, job_id=job_id, storage_url=storage_url, attempt=attempt, claim=nonce,
        allowed_prefixes=ctx.settings.allowed_prefixes, worker=ctx.worker,
        memory=tuple(memory.get()) if spec.resources.single_process and spec.checkpoint.memory_every_steps != "off"
        else None,
        peers=None if gang is None else PeersOrder(nodes=gang.nodes, address=gang.address, loss_wait_s=gang.loss_wait_s))
    process = control.process = TrainingProcess(order)
    try:
        return _serve(ctx, job_id, attempt, control, gang, process)
    except BaseException:  # the worker's side failed (Redis past the lease...): no attempt may train unserved
        process.kill("the worker's side failed")
        raise
    finally:
        process.close()


def _serve(ctx: WorkerContext, job_id: str, attempt: int, control: WorkerControl,
           gang: Optional["gang_runner.Leadership"], process: TrainingProcess) -> "str | Comeback":
    control._record({"pid": process.pid}, "the training process's pid")
    _log.info("job %s: attempt %d trains in process %d", job_id, attempt, process.pid)
    handlers = {"on_epoch": control.on_epoch, "on_resume": control.on_resume, "on_step": control.on_step,
                "on_commit": control.on_commit, "fence": control.fence}
    if gang is not None:  # a multi-node leader's peers (baton.workers.parallel.nodes.LeaderPeers)
        # through a Redis outage while the lease may be valid (LeaseUnconfirmed after: a loss, not the job's)
        handlers[ANNOUNCE] = lambda *args: control.leased(lambda: gang.announce(*args), "the gang's start")
        handlers[REMOTE_FAILURE] = gang.remote_failure
    ended = process.serve(handlers, control.stop_flag)
    if ended.result is None:
        if process.killed_for == "stalled":
            return "stalled"  # the watchdog has released it
        return _crashed(ctx, control, ended.death, gang)
    return _ended(ctx, job_id, attempt, control, ended.result)


def _ended(ctx: WorkerContext, job_id: str, attempt: int, control: WorkerControl, result: AttemptEnd) -> str:
    """What the training process said of its attempt's end, recorded."""
    failure = result.failure
    if failure is not None:
        return _failure_ended(ctx, job_id, attempt, control, failure)
    outcome = result.outcome
    assert outcome is not None
    if not outcome.completed:
        _log.info("job %s: stopped at step %s after a committed checkpoint (%s)", job_id, outcome.step, outcome.reason)
        # progress writes are spaced out: the last one may be older than the checkpoint the job stopped with
        control._record({"step": outcome.step}, "the step it stopped at")
    if outcome.completed:
        _finish(control, JobState.succeeded)
        _log.info("job %s: succeeded", job_id)
        return "succeeded"
    if outcome.reason == "cancelled":
        _finish(control, JobState.cancelled)
        return "cancelled"
    _release(ctx, control, f"{outcome.reason} on {ctx.worker}")
    return "released"


def _failure_ended(ctx: WorkerContext, job_id: str, attempt: int, control: WorkerControl, failure: Failure) -> str:
    message = failure.message
    if failure.ending is Ending.FENCED:
        return _fenced(job_id, attempt, message)
    if failure.ending is Ending.STORAGE:
        _release(ctx, control, f"storage unavailable on {ctx.worker}: {message}", kind="storage")
        return "released"
    if failure.ending is Ending.NODE_RELEASED:  # another node of the gang is shutting down: as a preemption
        _release(ctx, control, message)
        return "released"
    if failure.ending is Ending.RANK_LOST:  # a data-parallel rank died: infrastructure, counted as a worker loss
        _release_lost(ctx, control, f"{message} on {ctx.worker}")
        return "lost"
    if failure.ending is Ending.CHECKPOINT_WRITE:  # this machine's disk or /dev/shm: another worker resumes the job
        _release_lost(ctx, control, f"{message} on {ctx.worker}", metric_reason="checkpoint_write")
        return "lost"
    if failure.step is not None:  # the job's own code (or its spec) failed: record it, do not retry
        control.step_now = failure.step  # (the last progress report may be older)
    return _failed(ctx, control, failure.summary or message, failure.traceback or "", f"{failure.type}: {message}")


def _fenced(job_id: str, attempt: int, why: object) -> str:
    prometheus.FENCING_EVENTS.inc()
    _log.warning("job %s attempt %d: fenced out (%s); stopped without committing", job_id, attempt, why)
    return "fenced"


def _failed(ctx: WorkerContext, control: WorkerControl, error: str, traceback: str, what: str) -> str:
    where = {} if control.step_now is None else {"step": control.step_now}
    _finish(control, JobState.failed, {"error": ctx.redact(error), "traceback": ctx.redact(traceback), **where})
    _log.error("job %s: failed: %s", control.job_id, what)
    return "failed"


def _crashed(ctx: WorkerContext, control: WorkerControl, death: Death,
             gang: Optional["gang_runner.Leadership"]) -> "str | Comeback":
    """The training process died without ending its attempt: a worker loss, counted. The next attempt
    is this worker's to run at once (from the copy the process left in memory, else its checkpoint)
    when the process had made a step here (one that dies before its first step may die of this node:
    any worker takes it), the worker is not shutting down, and the job runs on this node alone."""
    reason = f"{death.describe()} on {ctx.worker}"
    here = control.step_now is not None and gang is None and not ctx.preemption.requested.is_set()
    _log.error("job %s: %s; released as a worker loss%s", control.job_id, reason,
               ", resuming here" if here else "")
    next_attempt = control.leased(lambda: ctx.records.release_lost(control.job_id, control.token, ctx.redact(reason), ""),
                                  "the release of a lost attempt")
    if next_attempt <= 0:
        return "lost"
    prometheus.JOBS_RETRIED.labels("crashed").inc()
    if here:
        return Comeback(next_attempt, death)
    _publish(ctx, control.job_id, next_attempt)
    return "lost"
