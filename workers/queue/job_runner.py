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
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

import redis
from kombu.exceptions import KombuError

from baton.jobs import keys
from baton.jobs.display import summary
from baton.jobs.records import JobRecords
from baton.jobs.redaction import Redactor
from baton.schemas.errors import (CheckpointWriteFailed, FencedOut, LeaseUnconfirmed, SpecError, TransientError,
                                  formatted_traceback)
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.metrics import val_metrics
from baton.schemas.settings import BatonSettings
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.schemas.targets import disallowed_targets
from baton.storage.checkpointer import CheckpointStats
from baton.storage.open import open_store
from baton.workers.attempt.session import run_attempt
from baton.workers.parallel.errors import NodeReleased, RankLost
from baton.workers.parallel.launcher import devices_missing, offered_gpus
from baton.workers.tracking import prometheus
from baton.workers.training.control import LoopControl, StepReport, describe_row
from baton.workers.training.targets import unavailable

from . import gang_runner, lease
from .claims import catch_up_with_manifest, release_if_still_mine
from .job_store import StoreChecks
from .preemption import Preemption
from .redis_retry import TRANSIENT_REDIS_ERRORS, while_leased
from .stall import StallWatchdog, exit_process

_log = logging.getLogger("baton.worker")
T = TypeVar("T")

PROGRESS_EVERY_S = 0.5
"""Least time between two progress writes to the job record."""


@dataclass
class WorkerContext:
    """What a worker process sets up once and every job it runs shares."""

    settings: BatonSettings
    redis: redis.Redis
    records: JobRecords
    publish: Callable[[str, int, str], None]  # (job id, attempt, queue)
    preemption: Preemption
    worker: str
    publish_join: Callable[[str, int, int, str], None] = lambda job_id, attempt, nodes, queue: None  # a gang's join
    offered_gpus: Callable[[], int] = offered_gpus  # GPUs this worker process can give a job's ranks
    redact: Redactor = field(default_factory=Redactor)  # every text recorded about a job passes through it
    stores: StoreChecks = field(init=False)  # the stores this worker probed (its own: BATON_STORAGE_URL)

    def __post_init__(self) -> None:
        self.stores = StoreChecks(self.settings.storage_url)


class WorkerControl(LoopControl):
    """The loop's view of the lease, the cancel flag and the worker's shutdown."""

    def __init__(self, ctx: WorkerContext, job_id: str, heartbeat: lease.Heartbeat):
        self.ctx, self.job_id, self.heartbeat = ctx, job_id, heartbeat
        self._last_progress = 0.0
        self._last_step = None
        self.step_now: Optional[int] = None  # the last optimizer step completed (progress records are spaced out)
        self._progress_failing = False
        self.stall: Optional[StallWatchdog] = None

    @property
    def token(self) -> str:
        """The lease this attempt holds (it changes when the attempt catches up with the manifest)."""
        return self.heartbeat.token

    def leased(self, call: Callable[[], T], what: str) -> T:
        """``call()`` through a Redis outage while the lease may be valid; LeaseUnconfirmed after."""
        try:
            return while_leased(call, self.heartbeat.valid_until, f"job {self.job_id}: {what}")
        except FencedOut as exc:
            if isinstance(exc, LeaseUnconfirmed):
                self.heartbeat.unreachable.set()
            self.heartbeat.fenced.set()
            raise

    def fence(self) -> None:
        """Raise FencedOut unless this attempt still holds the job (checked before every commit)."""
        if self.heartbeat.fenced.is_set() or not self.leased(
                lambda: self.ctx.records.fenced_set(self.job_id, self.token, {}), "the checkpoint fence"):
            self.heartbeat.fenced.set()
            raise FencedOut(f"job {self.job_id}: lease {self.token} no longer holds the job")

    def _record(self, fields: dict, what: str) -> None:
        if not self.leased(lambda: self.ctx.records.fenced_set(self.job_id, self.token,
                                                               {**fields, "updated_at": time.time()}), what):
            self.heartbeat.fenced.set()

    def _record_progress(self, fields: dict) -> bool:
        """One try, never waited for: the loop must not stall on a progress line, and the next step's
        write carries newer values. The heartbeat decides whether the lease is lost."""
        try:
            self._record_once(fields)
        except TRANSIENT_REDIS_ERRORS as exc:
            if not self._progress_failing:
                _log.warning("job %s: progress not recorded, Redis unavailable (%s: %s); training goes on",
                             self.job_id, type(exc).__name__, exc)
            self._progress_failing = True
            return False
        self._progress_failing = False
        return True

    def _record_once(self, fields: dict) -> None:
        if not self.ctx.records.fenced_set(self.job_id, self.token, {**fields, "updated_at": time.time()}):
            self.heartbeat.fenced.set()

    def stop_reason(self) -> Optional[str]:
        if self.heartbeat.fenced.is_set():
            raise FencedOut(f"job {self.job_id}: lease {self.token} lost")
        if self.heartbeat.cancel_requested.is_set():
            return "cancelled"
        if self.ctx.preemption.requested.is_set() or self.heartbeat.worker_stopping.is_set():
            return "preempted"
        return None

    def on_step(self, report: StepReport) -> None:
        self.step_now = report.step
        if self.stall is not None:
            self.stall.progress()
        prometheus.STEPS.inc()
        elapsed = time.monotonic() - self._last_progress
        if elapsed >= PROGRESS_EVERY_S or report.step == report.total_steps:
            if self._last_step is not None:
                prometheus.STEPS_PER_S.set((report.step - self._last_step) / elapsed)
            prometheus.SAMPLES_PER_S.set(report.samples_per_s)
            where = {"epoch": report.epoch + 1, **({"epochs": report.epochs} if report.epochs else {})}
            if self._record_progress({**where, "step": report.step, "total_steps": report.total_steps,
                                      "loss": report.loss, "lr": report.lr,
                                      "samples_per_s": round(report.samples_per_s, 1)}):
                self._last_progress, self._last_step = time.monotonic(), report.step

    def on_epoch(self, row: dict) -> None:
        metrics = val_metrics(row)
        self._record({**{k: row[k] for k in ("val_loss", "val_accuracy") if k in row}, "metrics": json.dumps(metrics)},
                     "the epoch's metrics")
        self.log(describe_row(row))

    def on_commit(self, manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        prometheus.CHECKPOINT_STALL.observe(stats.stall_s)
        prometheus.CHECKPOINT_WRITE.observe(stats.write_s)
        prometheus.CHECKPOINT_BYTES.inc(stats.bytes)
        fields = {"latest_checkpoint": manifest.latest.key}
        if manifest.best is not None:
            fields.update(best_checkpoint=manifest.best.key, best_value=manifest.best.value)
        self._record(fields, "the committed checkpoint's record")

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int) -> None:
        self._record({"resumed_from": step}, "the resume point")
        self.log(f"resuming from step {step} (epoch {epoch + 1}, batch {batch_in_epoch}) as attempt {attempt}")

    def log(self, message: str) -> None:
        _log.info("job %s: %s", self.job_id, message)


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


def _stalled(ctx: WorkerContext, control: "WorkerControl", idle_s: float, stacks: str) -> None:
    """The stall watchdog fired: give the job back as a worker loss, then leave this process."""
    job_id = control.job_id
    reason = f"no optimizer step for {idle_s:.0f}s on {ctx.worker} (BATON_STALL_TIMEOUT_S); stopped as hung"
    stacks = ctx.redact(stacks)
    _log.error("job %s: %s; every thread's stack:\n%s", job_id, reason, stacks)
    try:
        if not control.heartbeat.fenced.is_set():
            next_attempt = control.leased(lambda: ctx.records.release_lost(job_id, control.token, reason, stacks),
                                          "the release of a hung attempt")
            if next_attempt > 0:
                prometheus.JOBS_RETRIED.labels("stalled").inc()
                _publish(ctx, job_id, next_attempt)
    except (redis.RedisError, FencedOut) as exc:  # its lease expires once this process is gone: reaped instead
        _log.error("job %s: could not release the hung attempt (%s); its lease will expire", job_id, exc)
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
    nonce = lease.new_nonce()
    try:  # no lease yet: wait for Redis one lease TTL, then leave the message to the reaper's re-publish
        wait_until = time.monotonic() + ctx.settings.lease_ttl_s
        claimed = while_leased(lambda: lease.claim(ctx.redis, job_id, attempt, ctx.worker, ctx.settings.lease_ttl_s,
                                                   nonce),
                               lambda: wait_until, f"job {job_id}: the claim")
    except FencedOut as exc:
        _log.warning("job %s attempt %d: dropped (%s)", job_id, attempt, exc)
        return "dropped"
    if not claimed.ok:
        _log.info("job %s attempt %d: dropped (%s)", job_id, attempt, claimed.reason)
        return "dropped"
    spec_data = json.loads(claimed.spec)
    heartbeat = lease.Heartbeat(ctx.redis, job_id, claimed.token, ctx.worker, ctx.settings.lease_ttl_s,
                                ctx.settings.heartbeat_s, on_renew=prometheus.LEASE_RENEWALS.inc)
    heartbeat.start()
    prometheus.JOBS_STARTED.inc()
    prometheus.JOBS_RUNNING.inc()
    control = WorkerControl(ctx, job_id, heartbeat)
    ctx.preemption.register(job_id, lambda why: _release(ctx, control, why))
    if ctx.settings.stall_timeout_s > 0:
        control.stall = StallWatchdog(job_id, ctx.settings.stall_timeout_s,
                                      lambda idle_s, stacks: _stalled(ctx, control, idle_s, stacks))
        control.stall.start()
    _log.info("job %s: attempt %d started on %s", job_id, attempt, ctx.worker)
    outcome = "error"
    try:
        try:
            outcome = _train(ctx, job_id, attempt, nonce, spec_data, claimed.storage_url, control, gang)
        except FencedOut as exc:  # Redis stayed away past the lease while the outcome was being recorded
            prometheus.FENCING_EVENTS.inc()
            _log.warning("job %s attempt %d: %s; its lease will bring it back", job_id, attempt, exc)
            outcome = "fenced"
        if outcome == "fenced" and heartbeat.unreachable.is_set():
            heartbeat.stop()  # the lease is not renewed any more: the release below must find it as it is
            release_if_still_mine(control, lease.attempt_of(control.token), lambda n: _publish(ctx, job_id, n))
        return outcome
    finally:
        if control.stall is not None:
            control.stall.stop()
        heartbeat.stop()
        ctx.preemption.unregister(job_id)
        prometheus.JOBS_RUNNING.dec()
        prometheus.JOBS_FINISHED.labels(outcome).inc()


def _train(ctx: WorkerContext, job_id: str, attempt: int, nonce: str, spec_data: dict,
           storage_url: str, control: WorkerControl, gang: Optional["gang_runner.Leadership"] = None) -> str:
    try:
        spec = JobSpec.parse(spec_data)
        problems = disallowed_targets(spec.user_targets(), ctx.settings.allowed_prefixes)
        if problems:
            raise SpecError([f"{p} (on worker {ctx.worker})" for p in problems])
        store = open_store(storage_url)
        attempt = catch_up_with_manifest(control, attempt, nonce, store)
        result = run_attempt(spec, job_id, store, attempt, control, claim=nonce,
                             allowed_prefixes=ctx.settings.allowed_prefixes, fence=control.fence,
                             on_commit=control.on_commit, worker=ctx.worker, job_log=True, gang=gang)
    except FencedOut as exc:
        prometheus.FENCING_EVENTS.inc()
        _log.warning("job %s attempt %d: fenced out (%s); stopped without committing", job_id, attempt, exc)
        return "fenced"
    except TransientError as exc:
        _release(ctx, control, f"storage unavailable on {ctx.worker}: {exc}", kind="storage")
        return "released"
    except NodeReleased as exc:  # another node of the gang is shutting down: as a preemption, not counted
        _release(ctx, control, f"{exc}")
        return "released"
    except RankLost as exc:  # a data-parallel rank died: infrastructure, counted as a worker loss
        _release_lost(ctx, control, f"{exc} on {ctx.worker}")
        return "lost"
    except CheckpointWriteFailed as exc:  # this machine's disk or /dev/shm: another worker resumes the job
        _release_lost(ctx, control, f"{exc} on {ctx.worker}", metric_reason="checkpoint_write")
        return "lost"
    except Exception as exc:  # the job's own code (or its spec) failed: record it, do not retry
        where = {} if control.step_now is None else {"step": control.step_now}
        _finish(control, JobState.failed, {"error": ctx.redact(summary(exc, ctx.settings.allowed_prefixes)),
                                            "traceback": ctx.redact(formatted_traceback(exc)), **where})
        _log.error("job %s: failed: %s: %s", job_id, type(exc).__name__, exc)
        return "failed"
    outcome = result.outcome
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
