"""The worker's side of a running attempt: what a worker process sets up once (``WorkerContext``), and
what an attempt's training process asks of it (``WorkerControl``): the lease behind every record
and fence, the stop flag (cancel, preemption, fenced out), progress, metrics and commits for the job's
record and for Prometheus."""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

import redis

from baton.storage.records import events
from baton.storage.records.job_records import JobRecords
from baton.storage.redaction import Redactor
from baton.schemas.errors import FencedOut, LeaseUnconfirmed
from baton.schemas.hosting import WorkerOffer
from baton.schemas.manifest import CheckpointManifest
from baton.schemas.metrics import val_metrics
from baton.schemas.settings import BatonSettings
from baton.storage.checkpointing.contract import CheckpointStats
from baton.workers.attempt.process import Death
from baton.workers.parallel.gpu_probe import offered_gpus
from baton.workers.tracking import prometheus
from baton.workers.training.control import LoopControl, StepReport

from baton.workers.queue.heartbeat import Heartbeat
from baton.workers.queue.job_store import StoreChecks
from baton.workers.queue.preemption import Preemption
from baton.workers.code.cache import ShippedCode
from baton.workers.attempt.job_users import WORKER, JobUsers
from baton.workers.queue.redis_retry import while_leased

_log = logging.getLogger("baton.worker")
T = TypeVar("T")

PROGRESS_EVERY_S = 0.5
"""Least time between two progress measurements (the step rate's window). The record is written by the
lease's renewals (``Heartbeat.offer``), whatever the step rate."""


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
    users: JobUsers = field(default_factory=lambda: JobUsers(WORKER))  # who its jobs run as (set as it starts)
    queues: tuple[str, ...] = ("default",)  # the queues it serves (set as it starts consuming)
    stores: StoreChecks = field(init=False)  # the stores this worker probed (its own: BATON_STORAGE_URL)
    code: ShippedCode = field(init=False)  # the jobs' shipped code, unpacked here
    offer: WorkerOffer = field(init=False)  # what it offers every job (announced with its queues)
    run: str = field(init=False)  # this run of the worker: a "no" it says to a job holds until it restarts

    def __post_init__(self) -> None:
        self.stores = StoreChecks(self.settings.storage_url)
        self.code = ShippedCode(int(self.settings.code_limit_mb * 1e6))
        self.offer = WorkerOffer(accepts_code=self.settings.accept_code, modules=self.settings.allowed_prefixes,
                                 gpus=self.offered_gpus())
        self.run = f"{time.time():.6f}-{os.getpid()}"


class WorkerControl(LoopControl):
    """The loop's view of the lease, the cancel flag and the worker's shutdown."""

    def __init__(self, ctx: WorkerContext, job_id: str, heartbeat: Heartbeat, comeback: Optional[Death] = None,
                 on_progress: Optional[Callable[[], None]] = None):
        """``comeback``: the death of this job's previous training process here (its resume says so);
        ``on_progress``: told of every step's progress (the stall watchdog)."""
        self.ctx, self.job_id, self.heartbeat = ctx, job_id, heartbeat
        self.comeback, self._on_progress = comeback, on_progress
        self._last_progress = 0.0
        self._last_step: Optional[int] = None
        self.step_now: Optional[int] = None  # the last optimizer step completed (progress records are spaced out)

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
        """Raise FencedOut unless this attempt still holds the job (checked before every commit, in Redis:
        the lease's last renewal is no proof, since a Redis restored from a backup or failed over to a
        replica behind it can lose the lease while its holder's heartbeat still vouches for it)."""
        if self.heartbeat.fenced.is_set() or not self.leased(
                lambda: self.ctx.records.holds(self.job_id, self.token), "the checkpoint fence"):
            self.heartbeat.fenced.set()
            raise FencedOut(f"job {self.job_id}: lease {self.token} no longer holds the job")

    def record(self, fields: dict, what: str) -> None:
        """Write ``fields`` to the job's record, fenced by the lease (through a Redis outage while it may be valid)."""
        if not self.leased(lambda: self.ctx.records.fenced_set(self.job_id, self.token,
                                                               {**fields, "updated_at": time.time()}), what):
            self.heartbeat.fenced.set()

    def stop_reason(self) -> Optional[str]:
        if self.heartbeat.fenced.is_set():
            raise FencedOut(f"job {self.job_id}: lease {self.token} lost")
        if self.heartbeat.cancel_requested.is_set():
            return "cancelled"
        if self.ctx.preemption.requested.is_set() or self.heartbeat.worker_stopping.is_set():
            return "preempted"
        if self.heartbeat.yield_requested:
            return "yielded"
        return None

    def stop_flag(self) -> tuple[Optional[str], bool]:
        """``stop_reason`` for the training process's stop flag: (why to stop, whether fenced out)."""
        try:
            return self.stop_reason(), False
        except FencedOut:
            return None, True

    def on_step(self, report: StepReport, steps: int = 1) -> None:
        """A step's progress; ``steps``: how many were made since the last report (the training
        process reports at most every ``channel.STEP_REPORT_EVERY_S``)."""
        self.step_now = report.step
        if self._on_progress is not None:
            self._on_progress()
        prometheus.STEPS.inc(steps)
        elapsed = time.monotonic() - self._last_progress
        if elapsed >= PROGRESS_EVERY_S or report.step == report.total_steps:
            rate: dict[str, object] = {}
            if self._last_step is not None:
                steps_per_s = (report.step - self._last_step) / elapsed
                prometheus.STEPS_PER_S.set(steps_per_s)
                rate = {"steps_per_s": round(steps_per_s, 2)}
            prometheus.SAMPLES_PER_S.set(report.samples_per_s)
            where = {"epoch": report.epoch + 1, **({"epochs": report.epochs} if report.epochs else {}), **rate}
            total = {} if report.total_steps is None else {"total_steps": report.total_steps}  # (a stream: unknown)
            self.heartbeat.offer({**where, "step": report.step, **total, "loss": report.loss, "lr": report.lr,
                                  "samples_per_s": round(report.samples_per_s, 1)})
            self._last_progress, self._last_step = time.monotonic(), report.step

    def flush(self) -> None:
        """Write what was offered to the record and not yet renewed with (before the attempt's end is
        recorded), through a Redis outage while the lease may be valid, as the ending's own write."""
        if not self.heartbeat.fenced.is_set():
            self.heartbeat.write_pending(lambda fields: self.record(fields, "the last progress and commit"))

    def on_epoch(self, row: dict) -> None:
        """A validation's metrics, for the job's record (the training process logs its line), with the
        next renewal: a small model validates many times a second."""
        metrics = val_metrics(row)
        self.heartbeat.offer({**{k: row[k] for k in ("val_loss", "val_accuracy") if k in row},
                              "metrics": json.dumps(metrics)})

    def on_commit(self, manifest: CheckpointManifest, stats: CheckpointStats) -> None:
        prometheus.CHECKPOINT_STALL.observe(stats.stall_s)
        prometheus.CHECKPOINT_WRITE.observe(stats.write_s)
        prometheus.CHECKPOINT_BYTES.inc(stats.bytes)
        if manifest.latest is None:  # (a commit always lists its checkpoint)
            return
        fields: dict[str, object] = {"latest_checkpoint": manifest.latest.key}
        if manifest.best is not None:
            fields.update(best_checkpoint=manifest.best.key, best_value=manifest.best.value)
        self.heartbeat.offer(fields)  # with the next renewal: commits come as often as the writer allows

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        fields: dict = {"resumed_from": step}
        if self.comeback is not None:  # this worker's previous training process of the job died
            where = "in memory" if source == "memory" else "from its checkpoint"
            fields["last_event"] = (f"resumed {where} at step {step} after {self.comeback.signal_name} of pid "
                                    f"{self.comeback.pid}, {time.monotonic() - self.comeback.at:.1f} s")
            self.log(fields["last_event"])
        self.record(fields, "the resume point")  # (the training process logs the resume's line)
        how = "in memory" if source == "memory" else ("from scratch" if step == 0 else "from its checkpoint")
        self.leased(lambda: events.add(self.ctx.records.redis, self.job_id, "resumed", f"started {how} at step {step}"
                                       if step == 0 else f"resumed {how} at step {step}", step), "the resume event")

    def log(self, message: str) -> None:
        _log.info("job %s: %s", self.job_id, message)
