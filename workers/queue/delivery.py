"""One delivery of a job to a worker: read its record once, claim the attempt, train it under a lease,
record how it ended (``endings.ACTIONS``: one table from each ending to what is done).

How an attempt ends decides what happens to the job:
- finished: succeeded; cancelled (at a step boundary, after a checkpoint): cancelled;
- preempted (SIGTERM): checkpointed, then released and re-queued at once as the next attempt;
- an exception from the job's own model or data code: failed, with its traceback, not retried;
- storage unreachable beyond its retries: released and re-queued (infrastructure, not the job);
- fenced out (another attempt owns the job): nothing more is written;
- hung (no optimizer step for BATON_STALL_TIMEOUT_S): released as a worker loss with every
  thread's stack in its status, and the worker process exits (``stall.py``);
- the training process died: a worker loss; the next attempt runs here at once, from what that
  process left in memory, when it had made a step here and the job runs on this node alone.
A worker killed outright writes nothing; its lease expires and the reaper re-queues the job.

Redis going away (a restart, a failover) is none of these: every Redis call here is retried
while the lease may still be valid (``redis_retry.while_leased``); if Redis stays away longer,
the attempt stops as fenced out (``LeaseUnconfirmed``), committing nothing. When Redis answers
again, the job is released *if it is still this attempt's* (its lease, or a lease that lapsed
with the job untouched since), not counted as a loss; otherwise a reaper has re-queued it (also
uncounted, ``baton.storage.records.reaping``) or another attempt owns it (``claims.py``). Progress
records are not waited for: the next step writes newer ones.

Redis behind the store (``claims.py``): an attempt whose number the manifest has already passed
catches up past it before training, instead of being fenced out and lost.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import redis

from baton.schemas.errors import FencedOut, SpecError, TransientError, formatted_traceback
from baton.schemas.messages import AttemptEnd, AttemptOrder, Ending, Failure, PeersOrder
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState
from baton.schemas.targets import disallowed_targets
from baton.storage.memory.memory_dirs import JobMemory
from baton.storage.records import leases, pausing
from baton.storage.records.job_records import CANCELLED_AS_IT_STOPPED
from baton.workers.queue.store_gate import StoreGate
from baton.storage.stores.open import open_store
from baton.workers.attempt.process import Death, TrainingProcess
from baton.workers.parallel.peer_calls import ANNOUNCE, REMOTE_FAILURE
from baton.workers.queue import gang_leader, search_steps
from baton.workers.queue.claims import catch_up_with_manifest, release_if_still_mine
from baton.workers.queue.endings import ACTIONS
from baton.workers.queue.reception import JobView, pass_on, publish
from baton.workers.queue.heartbeat import Heartbeat
from baton.workers.queue.redis_retry import while_leased
from baton.workers.code.cache import CodeRefused
from baton.workers.queue.stall import StallWatchdog, exit_process
from baton.workers.queue.worker_control import WorkerContext, WorkerControl
from baton.workers.tracking import prometheus
from baton.workers.training.failures import summary

_log = logging.getLogger("baton.worker")


@dataclass(frozen=True)
class Comeback:
    """The training process died; the job's next attempt is this worker's to run at once."""

    attempt: int
    death: Death


class Delivery:
    """One message of a job on this worker: its record as read, the attempt the message is for, and the
    job's copies in memory here (kept from one training process to the next, removed when it leaves)."""

    def __init__(self, ctx: WorkerContext, job_id: str, attempt: int, view: JobView):
        self.ctx, self.job_id, self.attempt, self.view = ctx, job_id, attempt, view
        self.nodes, self.queue = view.nodes, view.queue
        self.memory = JobMemory()

    def pass_on(self, why: str, event: Optional[str] = None) -> str:
        return pass_on(self.ctx, self.job_id, self.attempt, why, event)

    def run(self, leadership: Optional["gang_leader.Leadership"] = None) -> str:
        """Claim the attempt and train it; when its training process dies, the next attempt is claimed
        and run here again, resuming from what that process left in memory."""
        comeback: Optional[Death] = None
        try:
            while True:
                ended = self._claim_and_run(leadership, comeback)
                if not isinstance(ended, Comeback):
                    return ended
                self.attempt, comeback = ended.attempt, ended.death
        finally:
            self.ctx.users.settle()  # (the copies' directories are lent to its user: none of its processes left)
            self.memory.remove()

    def _claim_and_run(self, leadership: Optional["gang_leader.Leadership"], comeback: Optional[Death]) -> "str | Comeback":
        ctx, job_id, attempt = self.ctx, self.job_id, self.attempt
        nonce = leases.new_nonce()
        try:  # no lease yet: wait for Redis one lease TTL, then leave the message to the reaper's re-publish
            wait_until = time.monotonic() + ctx.settings.lease_ttl_s
            claimed = while_leased(lambda: leases.claim(ctx.redis, job_id, attempt, ctx.worker,
                                                        ctx.settings.lease_ttl_s, nonce),
                                   lambda: wait_until, f"job {job_id}: the claim")
        except FencedOut as exc:
            _log.warning("job %s attempt %d: dropped (%s)", job_id, attempt, exc)
            return "dropped"
        if not claimed.ok:
            _log.info("job %s attempt %d: dropped (%s)", job_id, attempt, claimed.reason)
            return "dropped"
        return Held(self, nonce, claimed.token, leadership, comeback).run()


class Held:
    """One claimed attempt on this worker: its lease (the heartbeat), the control its training process
    asks, that process, the stall watchdog; it ends once (``end``)."""

    def __init__(self, delivery: Delivery, nonce: str, token: str, leadership: Optional["gang_leader.Leadership"],
                 comeback: Optional[Death]):
        ctx = delivery.ctx
        self.ctx, self.delivery, self.job_id, self.attempt = ctx, delivery, delivery.job_id, delivery.attempt
        self.nonce, self.leadership = nonce, leadership
        self.heartbeat = Heartbeat(ctx.redis, self.job_id, token, ctx.worker, ctx.settings.lease_ttl_s,
                                   ctx.settings.heartbeat_s, on_renew=prometheus.LEASE_RENEWALS.inc)
        self.stall: Optional[StallWatchdog] = None
        if ctx.settings.stall_timeout_s > 0:
            self.stall = StallWatchdog(self.job_id, ctx.settings.stall_timeout_s, self._stalled)
        self.control = WorkerControl(ctx, self.job_id, self.heartbeat, comeback=comeback,
                                     on_progress=self.stall.progress if self.stall is not None else None)
        self.process: Optional[TrainingProcess] = None

    # --- its life -------------------------------------------------------------------------------
    def run(self) -> "str | Comeback":
        ctx, job_id = self.ctx, self.job_id
        self.heartbeat.start()
        prometheus.JOBS_STARTED.inc()
        prometheus.JOBS_RUNNING.inc()
        ctx.preemption.register(job_id, self._stop_for_shutdown)
        if self.stall is not None:
            self.stall.start()
        _log.info("job %s: attempt %d started on %s", job_id, self.attempt, ctx.worker)
        word = "error"
        try:
            try:
                ended = self._prepare_and_train()
                word = "crashed" if isinstance(ended, Comeback) else ended
            except FencedOut as exc:  # Redis stayed away past the lease while the ending was being recorded
                prometheus.FENCING_EVENTS.inc()
                _log.warning("job %s attempt %d: %s; its lease will bring it back", job_id, self.attempt, exc)
                ended = word = "fenced"
            if word == "fenced" and self.heartbeat.unreachable.is_set():
                self.heartbeat.stop()  # the lease is not renewed any more: the release below must find it as it is
                release_if_still_mine(self.control, leases.attempt_of(self.control.token),
                                      lambda n: publish(ctx, job_id, n))
            return ended
        finally:
            prometheus.JOBS_RUNNING.dec()  # first: the job's record already says how it ended
            prometheus.JOBS_FINISHED.labels(word).inc()
            if self.stall is not None:
                self.stall.stop()
            self.heartbeat.stop()
            ctx.preemption.unregister(job_id)

    def _stop_for_shutdown(self, why: str) -> None:
        """This worker is shutting down past its grace (``preemption``): the job goes back, uncounted."""
        self.end(Ending.STOPPED, why)

    def _prepare_and_train(self) -> "str | Comeback":
        """Check the spec and the store, catch up with the manifest, then train in a training process."""
        ctx, view = self.ctx, self.delivery.view
        try:
            if view.spec is None:
                raise view.spec_error or SpecError(["spec: the job's record holds no spec"])
            spec = view.spec
            problems = disallowed_targets(spec.user_targets(), ctx.settings.allowed_prefixes)
            if problems:
                raise SpecError([f"{p} (on worker {ctx.worker})" for p in problems])
            storage_url = view.storage_url or ctx.settings.storage_url
            store = open_store(storage_url)
            self.attempt = catch_up_with_manifest(self.control, self.attempt, self.nonce, store)
            import_path, setup_log = ctx.code.import_path(store, spec.code)
        except FencedOut as exc:
            return self.end(Ending.FENCED, str(exc))
        except CodeRefused as exc:
            return self.end(Ending.CODE, f"{exc} on {ctx.worker}")
        except TransientError as exc:
            return self.end(Ending.STORAGE, f"storage unavailable on {ctx.worker}: {exc}")
        except Exception as exc:  # the job's spec or code as the worker found it: record it, do not retry
            return self.end(Ending.FAILED, f"{type(exc).__name__}: {exc}", failure=Failure(
                ending=Ending.FAILED, message=str(exc), type=type(exc).__name__,
                summary=summary(exc, ctx.settings.allowed_prefixes), traceback=formatted_traceback(exc),
                shown=f"error: {type(exc).__name__}: {exc}"))  # (no frame of the job's: baton's own words say it)
        for line in setup_log:
            _log.info("job %s: %s", self.job_id, line)
        # the training process's store: its job's objects; its user: the job's own (``job_users``)
        with StoreGate(store, self.job_id, ctx.redact) as gate, \
                ctx.users.lent(gate, import_path) as tenancy:
            order = self._order(spec, storage_url).model_copy(update={
                "import_path": import_path, "setup_log": tuple(setup_log), "store_gate": gate.url,
                "identity": tenancy.identity})
            tenancy.write(order.memory or ())
            self.process = TrainingProcess(order)
            try:
                return self._serve(self.process, order, gate)
            except BaseException:  # the worker's side failed (Redis past the lease...): no attempt may train unserved
                self.process.kill("the worker's side failed")
                raise
            finally:
                self.process.close()

    def _order(self, spec: JobSpec, storage_url: str) -> AttemptOrder:
        ctx, leadership = self.ctx, self.leadership
        keeps_copies = spec.resources.single_process and spec.checkpoint.memory_every_steps != "off"
        return AttemptOrder(
            spec=spec, job_id=self.job_id, storage_url=storage_url, attempt=self.attempt, claim=self.nonce,
            allowed_prefixes=ctx.settings.allowed_prefixes, worker=ctx.worker, pause_at=self.delivery.view.pause_at,
            memory=tuple(self.delivery.memory.get()) if keeps_copies else None,
            peers=None if leadership is None else PeersOrder(nodes=leadership.nodes, address=leadership.address,
                                                             loss_wait_s=leadership.loss_wait_s))

    def _serve(self, process: TrainingProcess, order: AttemptOrder, gate: StoreGate) -> "str | Comeback":
        control, leadership = self.control, self.leadership
        control.record({"pid": process.pid}, "the training process's pid")
        _log.info("job %s: attempt %d trains in process %d", self.job_id, self.attempt, process.pid)
        handlers: dict[str, Callable[..., Any]] = {
            "on_epoch": control.on_epoch, "on_resume": control.on_resume, "on_step": control.on_step,
            "on_commit": control.on_commit, "fence": control.fence}
        if leadership is not None:  # a multi-node leader's peers (baton.workers.parallel.nodes.LeaderPeers)
            # through a Redis outage while the lease may be valid (LeaseUnconfirmed after: a loss, not the job's)
            handlers[ANNOUNCE] = lambda endpoint, secret, group: control.leased(
                lambda: leadership.announce(endpoint, secret, group, order), "the gang's start")
            handlers[REMOTE_FAILURE] = leadership.remote_failure
        ended = process.serve(handlers, control.stop_flag)
        gate.close()  # what the attempt asked of the store has landed before its end is acted on
        if ended.result is not None:
            return self._said(ended.result)
        if process.killed_for == "stalled":
            return "stalled"  # the watchdog has released it
        assert ended.death is not None
        return self._crashed(ended.death)

    # --- how it ended ---------------------------------------------------------------------------
    def _said(self, result: AttemptEnd) -> str:
        """What the training process said of its attempt's end."""
        if result.failure is not None:
            failure = result.failure
            if failure.step is not None:
                self.control.step_now = failure.step  # (the last progress report may be older)
            detail = failure.message if failure.ending in (Ending.FENCED, Ending.NODE_RELEASED) else (
                f"storage unavailable on {self.ctx.worker}: {failure.message}" if failure.ending is Ending.STORAGE
                else f"{failure.message} on {self.ctx.worker}")
            if failure.ending is Ending.FAILED:
                detail = f"{failure.type}: {failure.message}"
            return self.end(failure.ending, detail, failure=failure)
        outcome = result.outcome
        assert outcome is not None
        if outcome.completed:
            return self.end(Ending.SUCCEEDED, "succeeded")
        _log.info("job %s: stopped at step %s after a committed checkpoint (%s)", self.job_id, outcome.step,
                  outcome.reason)
        # progress goes with the renewals: the last one may be older than the checkpoint the job stopped with
        self.heartbeat.offer({"step": outcome.step})  # (written by end()'s flush)
        if outcome.reason in ("cancelled", "paused"):  # (a pause: at the validation its pause_at asked for)
            return self.end(Ending(outcome.reason), f"{outcome.reason} at step {outcome.step} on {self.ctx.worker}")
        if outcome.reason == "yielded":  # the scheduler's words: "yielded to job X (priority 10)"
            return self.end(Ending.STOPPED, f"{self.heartbeat.yield_requested} on {self.ctx.worker}")
        if outcome.reason == "preempted" and self.ctx.preemption.why:  # SIGTERM, or the machine's notice
            return self.end(Ending.STOPPED, f"preempted ({self.ctx.preemption.why}) on {self.ctx.worker}")
        return self.end(Ending.STOPPED, f"{outcome.reason} on {self.ctx.worker}")

    def end(self, ending: Ending, reason: str, failure: Optional[Failure] = None, stacks: str = "") -> str:
        """Record ``ending`` as its action says (``endings.ACTIONS``); the delivery's word for it."""
        ctx, control, job_id = self.ctx, self.control, self.job_id
        action = ACTIONS[ending]
        reason = ctx.redact(reason)
        control.flush()  # the progress and commit the last renewal did not carry
        if action.kind == "none":
            prometheus.FENCING_EVENTS.inc()
            _log.warning("job %s attempt %d: fenced out (%s); stopped without committing", job_id, self.attempt, reason)
        elif action.kind == "finish":
            state = action.state
            assert state is not None
            control.leased(lambda: ctx.records.finish(job_id, control.token, state), f"recording the job {state.value}")
            _log.info("job %s: %s", job_id, action.word)
        elif action.kind == "fail":
            self._fail(failure, reason)
        elif action.kind == "pause":
            control.leased(lambda: pausing.pause(ctx.redis, job_id, control.token, reason), "recording the pause")
        else:
            self._requeue(action.kind == "lose", reason, action.retried or ending.value, stacks)
        if action.kind in ("finish", "fail", "pause"):
            search_steps.after_ending(ctx.redis, job_id, ctx.publish)
        return action.word

    def _fail(self, failure: Optional[Failure], what: str) -> None:
        ctx, control = self.ctx, self.control
        error = (failure.summary if failure is not None else None) or what
        trace = (failure.traceback if failure is not None else None) or ""
        shown = (failure.shown if failure is not None else None) or ""
        where = {} if control.step_now is None else {"step": control.step_now}
        fields = {"error": ctx.redact(error), "traceback": ctx.redact(trace), "failure": ctx.redact(shown), **where}
        control.leased(lambda: ctx.records.finish(self.job_id, control.token, JobState.failed, fields),
                       "recording the job failed")
        _log.error("job %s: failed: %s", self.job_id, what)

    def _requeue(self, lost: bool, reason: str, retried: str, stacks: str = "") -> int:
        """Give the job back for another worker now, as its next attempt: a worker loss (counted) or not."""
        ctx, control, job_id = self.ctx, self.control, self.job_id
        if lost:
            _log.error("job %s: %s; released as a worker loss", job_id, reason)
            next_attempt = control.leased(lambda: ctx.records.release_lost(job_id, control.token, reason, stacks),
                                          "the release of a lost attempt")
        else:
            yielded = retried == "preempted"  # (a stop at a step: a yield; its store away is no yield)
            next_attempt = control.leased(lambda: ctx.records.release(job_id, control.token, reason, yielded),
                                          "the release")
        if next_attempt == CANCELLED_AS_IT_STOPPED:
            _log.info("job %s: cancelled (asked while it stopped: %s)", job_id, reason)
        if next_attempt <= 0:
            return next_attempt  # fenced out already (someone else owns it), or cancelled
        prometheus.JOBS_RETRIED.labels(retried).inc()
        publish(ctx, job_id, next_attempt)
        if not lost:
            _log.warning("job %s: released (%s), queued as attempt %d", job_id, reason, next_attempt)
        return next_attempt

    def _crashed(self, death: Death) -> "str | Comeback":
        """The training process died without ending its attempt: a worker loss, counted. The next attempt
        is this worker's to run at once (from the copy the process left in memory, else its checkpoint)
        when the process had made a step here (one that dies before its first step may die of this node:
        any worker takes it), the worker is not shutting down, and the job runs on this node alone."""
        ctx, control = self.ctx, self.control
        control.flush()
        reason = ctx.redact(f"{death.describe()} on {ctx.worker}")
        here = control.step_now is not None and self.leadership is None and not ctx.preemption.requested.is_set()
        _log.error("job %s: %s; released as a worker loss%s", self.job_id, reason, ", resuming here" if here else "")
        next_attempt = control.leased(lambda: ctx.records.release_lost(self.job_id, control.token, reason, ""),
                                      "the release of a lost attempt")
        if next_attempt == CANCELLED_AS_IT_STOPPED:
            _log.info("job %s: cancelled (asked for before its training process died)", self.job_id)
            return "cancelled"
        if next_attempt <= 0:
            return "lost"
        prometheus.JOBS_RETRIED.labels("crashed").inc()
        if here:
            return Comeback(next_attempt, death)
        publish(ctx, self.job_id, next_attempt)
        return "lost"

    def _stalled(self, idle_s: float, own_stacks: str) -> None:
        """The stall watchdog fired: the training process's stacks recorded, it and everything below it
        killed, the job given back as a worker loss. A worker hung itself before its training process
        started (``own_stacks``: its threads') hands the job back and leaves."""
        ctx, process, job_id = self.ctx, self.process, self.job_id
        if process is not None and process.reported_end:
            return  # it said how its attempt ended meanwhile: that is recorded instead
        reason = f"no optimizer step for {idle_s:.0f}s on {ctx.worker} (BATON_STALL_TIMEOUT_S); stopped as hung"
        stacks = ctx.redact(process.stacks() if process is not None else own_stacks)
        _log.error("job %s: %s; every thread's stack:\n%s", job_id, reason, stacks)
        if process is not None:
            process.kill("stalled")
        try:
            if not self.heartbeat.fenced.is_set():
                self.end(Ending.STALLED, reason, stacks=stacks)
        except (redis.RedisError, FencedOut) as exc:  # its lease expires once this attempt is gone: reaped instead
            _log.error("job %s: could not release the hung attempt (%s); its lease will expire", job_id, exc)
        if process is None:
            exit_process(f"job {job_id} hung; a fresh worker process must take over")
