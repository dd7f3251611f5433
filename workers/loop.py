"""The training loop. Each phase is one method, readable top to bottom.

Per optimizer step: zero_grad(set_to_none) at the start of an accumulation group; per
micro-batch forward under autocast, loss.item() checked for non-finite values, (loss / group
size) backward through the scaler; at the group's end unscale, clip (the pre-clip norm is
logged), step, scaler update, then a per-step scheduler. Per epoch: model.train() before
training, validation in eval mode without autograd (mode restored after), a per-epoch
scheduler, the metrics row, the best tracker, a checkpoint. Checkpoints fall on optimizer-step
boundaries only.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from schemas.errors import NonFiniteLossError
from schemas.metrics import MetricsRow
from storage.checkpointer import AsyncCheckpointer, CheckpointRequest

from . import train_state
from .amp import optimizer_step
from .components import Components
from .control import LoopControl, StepReport
from .evaluate import evaluate
from .progress import BestTracker, Progress


@dataclass
class Outcome:
    completed: bool
    reason: Optional[str] = None  # why it stopped early
    step: Optional[int] = None  # the optimizer step of its last checkpoint


@dataclass
class TrainingLoop:
    parts: Components
    checkpointer: AsyncCheckpointer
    control: LoopControl
    cpu_threads: int
    progress: Progress = field(default_factory=Progress)
    best: Optional[BestTracker] = None
    metrics: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = self.parts.spec
        if self.best is None:
            self.best = BestTracker(spec.checkpoint.monitor, spec.checkpoint.mode)
        self._group_nonfinite = False
        self._clock = time.perf_counter()
        self._samples_timed = 0
        self._last_loss = math.nan

    # --- phases ----------------------------------------------------------------------------
    def run(self) -> Outcome:
        epochs = self.parts.spec.loop.epochs
        while self.progress.epoch < epochs:
            reason = self.train_epoch()
            if reason is not None and self.progress.batch_in_epoch < self.parts.data.batches_per_epoch:
                return self._stop(reason)
            self.end_epoch()
            reason = reason or self.control.stop_reason()
            if reason is not None and self.progress.epoch < epochs:
                self.checkpointer.wait()  # the epoch-end checkpoint is the stop checkpoint
                return Outcome(False, reason, self.progress.global_step)
        return Outcome(True, step=self.progress.global_step)

    def train_epoch(self) -> Optional[str]:
        """Train to the end of the epoch, or until a stop is asked for (returns its reason)."""
        p, parts = self.progress, self.parts
        parts.model.train()
        self._clock, self._samples_timed = time.perf_counter(), 0
        n, accum = parts.data.batches_per_epoch, parts.spec.loop.grad_accum_steps
        for x, y in parts.data.train_loader(p.epoch, start_batch=p.batch_in_epoch):
            group_start = (p.batch_in_epoch // accum) * accum
            group_size = min(accum, n - group_start)
            if p.batch_in_epoch == group_start:
                parts.optimizer.zero_grad(set_to_none=True)
                self._group_nonfinite = False
            self.micro_step(x, y, group_size)
            if p.batch_in_epoch - group_start == group_size:
                self.step()
                reason = self.control.stop_reason()
                if reason is not None:
                    return reason
                self._periodic_checkpoint()
        return None

    def micro_step(self, x: torch.Tensor, y: torch.Tensor, group_size: int) -> None:
        p, parts = self.progress, self.parts
        x, y = x.to(parts.device, non_blocking=True), y.to(parts.device, non_blocking=True)
        with parts.precision.autocast():
            logits = parts.model(x)
            loss = F.cross_entropy(logits, y)
        value = loss.item()
        p.batch_in_epoch += 1
        p.micro_step += 1
        if not math.isfinite(value):
            if parts.spec.loop.nonfinite == "fail":
                raise NonFiniteLossError(
                    f"training loss is {value} at epoch {p.epoch}, batch {p.batch_in_epoch - 1} "
                    f"(step {p.global_step}); policy loop.nonfinite: fail"
                )
            self._group_nonfinite = True
            return
        parts.scaler.scale(loss / group_size).backward()
        p.epoch_loss_sum += value * len(y)
        p.epoch_samples += len(y)
        self._samples_timed += len(y)
        self._last_loss = value

    def step(self) -> None:
        p, parts = self.progress, self.parts
        if self._group_nonfinite:
            parts.optimizer.zero_grad(set_to_none=True)
            p.nonfinite_steps += 1
            self.control.log(f"step {p.global_step}: non-finite loss, optimizer step skipped (loop.nonfinite: skip)")
        else:
            p.record_grad_norm(optimizer_step(parts.model, parts.optimizer, parts.scaler, parts.spec.loop.max_grad_norm))
        if parts.scheduler is not None and parts.spec.scheduler.per_step:
            parts.scheduler.step()
        p.global_step += 1
        self.control.on_step(StepReport(
            epoch=p.epoch, epochs=parts.spec.loop.epochs, step=p.global_step, total_steps=parts.total_steps,
            loss=self._last_loss, lr=self._lr(), samples_per_s=self._throughput(),
        ))

    def end_epoch(self) -> None:
        """Validate, step a per-epoch scheduler, record the row and the best, checkpoint."""
        p, parts = self.progress, self.parts
        val_loss, val_acc = evaluate(parts.model, parts.data.val_loader(), parts.device, parts.precision)
        lr = self._lr()
        if parts.scheduler is not None and not parts.spec.scheduler.per_step:
            parts.scheduler.step()
        train_loss = p.epoch_loss_sum / p.epoch_samples if p.epoch_samples else math.nan
        values = {"val_loss": val_loss, "val_accuracy": val_acc, "train_loss": train_loss}
        is_best = self.best.update(values[self.best.metric], p.global_step, p.epoch)
        row = MetricsRow(
            epoch=p.epoch, step=p.global_step, train_loss=train_loss, val_loss=val_loss, val_accuracy=val_acc,
            lr=lr, grad_norm=p.epoch_grad_norm_sum / p.epoch_steps if p.epoch_steps else math.nan,
            grad_norm_max=p.epoch_grad_norm_max, nonfinite_steps=p.nonfinite_steps,
            samples_per_s=self._throughput(), epoch_s=time.perf_counter() - self._clock,
            checkpoint=self.checkpointer.paths.checkpoint(p.global_step), is_best=is_best,
            **self._checkpoint_costs(),
        ).model_dump()
        self.metrics.append(row)
        self.control.on_epoch(row)
        p.start_next_epoch()
        best = (self.best.metric, values[self.best.metric]) if is_best else None
        self._checkpoint("epoch", mandatory=True, best=best, with_metrics=True)

    # --- checkpoints -----------------------------------------------------------------------
    def _periodic_checkpoint(self) -> None:
        every = self.parts.spec.checkpoint.every_steps
        p = self.progress
        # the epoch's last step is covered by the epoch-end checkpoint moments later
        if every and p.global_step % every == 0 and p.batch_in_epoch < self.parts.data.batches_per_epoch:
            self._checkpoint("step", mandatory=False)

    def _stop(self, reason: str) -> Outcome:
        self._checkpoint("stop", mandatory=True)
        self.checkpointer.wait()
        return Outcome(False, reason, self.progress.global_step)

    def _checkpoint(self, kind: str, mandatory: bool, best=None, with_metrics: bool = False) -> None:
        p = self.progress
        request = CheckpointRequest(
            step=p.global_step, epoch=p.epoch, batch_in_epoch=p.batch_in_epoch, kind=kind, best=best,
            metrics_rows=list(self.metrics) if with_metrics else None,
        )
        self.checkpointer.save(lambda: train_state.capture(self.parts, p, self.best, self.metrics, self.cpu_threads),
                               request, mandatory=mandatory)

    def _checkpoint_costs(self) -> dict:
        self.checkpointer.poll()
        done, self.checkpointer.totals.done = self.checkpointer.totals.done, []
        return {
            "ckpt_count": len(done),
            "ckpt_skipped": self.checkpointer.totals.skipped,
            "ckpt_stall_s": sum(s.stall_s for s in done),
            "ckpt_write_s": sum(s.write_s for s in done),
            "ckpt_bytes": sum(s.bytes for s in done),
        }

    # --- small readings --------------------------------------------------------------------
    def _lr(self) -> float:
        return float(self.parts.optimizer.param_groups[0]["lr"])

    def _throughput(self) -> float:
        elapsed = time.perf_counter() - self._clock
        return self._samples_timed / elapsed if elapsed > 0 else 0.0
