"""The training loop. Each phase is one method, readable top to bottom.

Per optimizer step: zero_grad(set_to_none) at the start of an accumulation group; per
micro-batch the batch moved to the device, the task's loss under autocast, checked for
non-finite values, (loss / group size) backward through the scaler; at the group's end
unscale, clip (the pre-clip norm is logged), step, scaler update, then a per-step scheduler.
Validation (eval mode, no autograd, the task's metrics; mode restored after) runs at each
epoch's end, every ``eval_every_steps`` and at the end of a step-based run; each is followed by
the metrics row, the best tracker and a checkpoint (spaced by time, but for a new best, a stop, the end);
a per-epoch scheduler steps at epoch ends.
Checkpoints fall on optimizer-step boundaries only. Losses and gradient norms stay on the device
until the group's step reads them in one transfer (readings.py). On CUDA a checkpoint's
device-to-host copy of the parameters and optimizer state overlaps the next forward/backward;
the loop waits for it just before the next optimizer step (storage/checkpointing/snapshot.py).

A run is epoch-based (``loop.epochs``) or step-based (``loop.max_steps``, passing over the data
as often as needed). When a pass's length is known (map-style data), its last accumulation
group may be short and steps with its own divisor; a stream's groups continue across passes.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

from baton.schemas.errors import NonFiniteLossError
from baton.schemas.messages import Outcome
from baton.schemas.metrics import MetricsRow
from baton.storage import failpoints
from baton.storage.checkpointing.contract import Checkpointer, CheckpointRequest, Spacing
from baton.storage.memory.memory_copy import MemoryCopier

from baton.workers.training import train_state
from baton.workers.training.amp import optimizer_step_norm_tensor
from baton.workers.training.batches import batch_size, to_device
from baton.workers.training.components import Components
from baton.workers.training.control import LoopControl, StepReport
from baton.workers.training.data import add_note
from baton.workers.training.evaluate import evaluate
from baton.workers.training.layout import Layout, OneProcess, Restored
from baton.workers.training.progress import BestTracker, Progress
from baton.workers.training.readings import PendingReadings, step_lr
from baton.workers.training.streams import StreamPlan

CURVE_POINTS = 1000
"""About how many points a run's per-step training curve has (a metrics row's ``train_curve``): each is
the mean loss of ``total steps / CURVE_POINTS`` steps."""


class TrainingLoop:
    """One rank's loop: ``parts`` trained under ``control``, checkpointed by ``checkpointer``, its work
    shared with the other ranks as ``layout`` says (None: one process), its last step copied to
    ``memory`` where it has one, resumed from ``restored`` (its progress, best tracker and rows), paused
    at the validation that reaches ``pause_at`` (epochs done for an epoch-based run, steps for a step-based
    one; None: trained to its end)."""

    def __init__(self, parts: Components, checkpointer: Checkpointer, control: LoopControl, cpu_threads: int,
                 layout: Optional[Layout] = None, memory: Optional[MemoryCopier] = None,
                 restored: Optional[Restored] = None, pause_at: Optional[int] = None):
        spec = parts.spec
        self.pause_at = pause_at
        self.parts, self.checkpointer, self.control, self.cpu_threads = parts, checkpointer, control, cpu_threads
        self.layout: Layout = layout if layout is not None else OneProcess(parts.device)
        self.memory = memory  # the last step in host memory, for a crash (storage/memory/memory_copy.py)
        self.progress, self.best, self.metrics = restored if restored is not None else (
            Progress(), BestTracker(spec.checkpoint.monitor, spec.monitor_mode), [])
        self._group_nonfinite: Optional[str] = None  # where this step's first non-finite loss was, if any
        self._total_steps = parts.total_steps  # (fixed once the parts are restored; read every step)
        self._curve_every = max(1, (self._total_steps or CURVE_POINTS) // CURVE_POINTS)
        self._validated_at: Optional[int] = None  # the step of the last validation
        self._committed_at: Optional[int] = None  # ...and of the last one checkpointed
        self._spacing = Spacing(spec.checkpoint.min_interval_s)  # (when this rank last saw a checkpoint taken)
        self._rows_committed = 0  # rows a checkpoint taken by this attempt carried (0 at a start: carry them all)
        self._exhausted = False  # whether the current pass's iterator ran out (streams' only way to know)
        self._clock = time.perf_counter()
        self._samples_timed = 0
        self._last_loss = math.nan
        self._pending = PendingReadings()  # losses and norms still on the device (read once per step)
        self._scaling = self.parts.scaler.is_enabled()  # a disabled GradScaler's scale() returns the loss as is
        self._validating = False

    # --- phases ----------------------------------------------------------------------------
    def run(self) -> Outcome:
        """Train to the end or to a stop; an exception is noted with where it happened (epoch, step)."""
        try:
            return self._run()
        except NonFiniteLossError:  # its message names the very micro-batch and step; a note would be the step's
            raise
        except BaseException as exc:  # noqa: BLE001 - a job's asyncio.CancelledError or sys.exit() too
            add_note(exc, self._where())
            raise

    def _run(self) -> Outcome:
        p = self.progress
        if not self.finished() and self._paused_here():  # resumed from the very validation it pauses at
            return Outcome(completed=False, reason="paused", step=p.global_step)
        while not self.finished():
            reason = self.train_pass()
            if not self.finished() and self._pass_complete():
                self.end_pass()
                if self._validated_at == p.global_step:
                    reason = reason or self.control.stop_reason() or self._pause_due()
            if reason is not None and not self.finished():
                if self._committed_at != p.global_step:
                    return self._stop(reason)
                self.checkpointer.wait()  # the validation's checkpoint is the stop checkpoint
                return Outcome(completed=False, reason=reason, step=p.global_step)
        self._absorb_readings()
        return Outcome(completed=True, step=p.global_step)

    def finished(self) -> bool:
        loop, p = self.parts.spec.loop, self.progress
        if loop.max_steps is not None:
            return p.global_step >= loop.max_steps
        return loop.epochs is not None and p.epoch >= loop.epochs

    def train_pass(self) -> Optional[str]:
        """Train to the end of the pass (epoch), the end of the run, or a stop (returns its reason)."""
        p, parts = self.progress, self.parts
        parts.model.train()
        self._clock, self._samples_timed = time.perf_counter(), 0
        self._exhausted = False
        for batch in parts.data.train_batches(p.epoch, start_batch=p.batch_in_epoch, sample_offset=p.epoch_sample_offset):
            position, group_size = self._group()
            if position == 0:
                parts.optimizer.zero_grad(set_to_none=True)
                self._group_nonfinite = None
            self.micro_step(batch, group_size)
            if position + 1 == group_size:
                self.step()
                if self._validation_due():
                    self.validate("eval")
                reason = self.control.stop_reason() or self._pause_due()
                if reason is not None or self.finished():
                    return reason
                self._periodic_checkpoint()
                self._memory_copy()
        self._exhausted = True
        return None

    def micro_step(self, batch: Any, group_size: int) -> None:
        """Forward and backward; the loss stays on the device until the group's step reads it
        (a non-finite one is caught there, before the optimizer could step on it)."""
        p, parts = self.progress, self.parts
        batch = to_device(batch, parts.device)
        with parts.precision.autocast():
            loss = parts.task.loss(parts.model, batch)
        self._pending.add_loss(loss, batch_size(batch), p.epoch, p.batch_in_epoch, p.global_step,
                               step_lr(parts.optimizer))
        p.batch_in_epoch += 1
        p.micro_step += 1
        # dividing by 1 changes no bit of the loss or its gradients: skipped (an op and its backward a step)
        if group_size != 1:
            loss = loss / group_size
        (parts.scaler.scale(loss) if self._scaling else loss).backward()

    def _absorb_readings(self) -> None:
        """Read what is pending (one transfer) into the running sums, applying the non-finite
        policy to each loss in order: ``fail`` raises naming the micro-batch; ``skip`` marks the
        group, whose step is then skipped and whose gradients are dropped."""
        p = self.progress
        losses, norms = self._pending.read()
        for norm in norms:
            p.record_grad_norm(norm)
        for reading in losses:
            if not math.isfinite(reading.value):
                where = (f"training loss is {reading.value} at epoch {reading.epoch + 1}, batch "
                         f"{reading.batch_in_epoch + 1} (step {reading.step + 1})")
                if self.parts.spec.loop.nonfinite == "fail":
                    raise NonFiniteLossError(f"{where}; policy loop.nonfinite: fail")
                self._group_nonfinite = self._group_nonfinite or where
                continue
            p.record_curve(reading.step, reading.value, reading.samples, self._curve_every, reading.lr)
            p.epoch_loss_sum += reading.value * reading.samples
            p.epoch_samples += reading.samples
            self._samples_timed += reading.samples
            self._last_loss = reading.value

    def step(self) -> None:
        p, parts = self.progress, self.parts
        self._absorb_readings()
        if self._group_nonfinite:
            parts.optimizer.zero_grad(set_to_none=True)
            p.nonfinite_steps += 1
            self.control.log(f"{self._group_nonfinite}: optimizer step skipped (loop.nonfinite: skip)")
        else:
            self.checkpointer.before_optimizer_step()  # a snapshot still copying from these tensors
            if self.memory is not None:
                self.memory.before_optimizer_step()
            self._pending.add_norm(optimizer_step_norm_tensor(parts.model, parts.optimizer, parts.scaler,
                                                              parts.spec.loop.max_grad_norm))
        if parts.scheduler is not None and parts.spec.scheduler.per_step:
            parts.scheduler.step()
        p.global_step += 1
        self.control.on_step(StepReport(
            epoch=p.epoch, epochs=parts.spec.loop.epochs, step=p.global_step, total_steps=self._total_steps,
            loss=self._last_loss, lr=self._lr(), samples_per_s=self._throughput(),
        ))

    def end_pass(self) -> None:
        """An epoch-based run validates (then a per-epoch scheduler steps); either way the next pass begins."""
        p = self.progress
        if self.parts.spec.loop.epochs is not None:
            self.validate("epoch")
        else:
            p.start_next_pass()
        self.parts.data.end_pass()

    def validate(self, kind: str) -> None:
        """Score the validation set, record the row and the best, checkpoint (mandatory)."""
        p, parts = self.progress, self.parts
        self._absorb_readings()
        self._validating = True
        loader = parts.data.val_loader()
        forwards = self.layout.validation_forwards(loader)
        values = evaluate(parts.model, loader, parts.device, parts.precision, parts.task, forwards)
        self._validating = False
        lr = self._lr()
        if kind == "epoch" and parts.scheduler is not None and not parts.spec.scheduler.per_step:
            parts.scheduler.step()
        train_loss, train_curve = self._train_loss(), p.train_curve(self._curve_every, self.layout.sum_over_ranks)
        values["train_loss"] = train_loss
        is_best = self.best.update(values[self.best.metric], p.global_step, p.epoch + 1)
        row = MetricsRow(
            epoch=p.epoch + 1, step=p.global_step, train_loss=train_loss, train_curve=train_curve,
            lr_curve=p.lr_curve(self._curve_every), lr=lr,
            grad_norm=p.epoch_grad_norm_sum / p.epoch_steps if p.epoch_steps else math.nan,
            grad_norm_max=p.epoch_grad_norm_max, nonfinite_steps=p.nonfinite_steps,
            samples_per_s=self._throughput(), epoch_s=time.perf_counter() - self._clock, time=time.time(),
            checkpoint=self.checkpointer.checkpoint_key(p.global_step), is_best=is_best,
            **self._checkpoint_costs(), **{k: v for k, v in values.items() if k != "train_loss"},
        ).model_dump()
        for curve in ("train_curve", "lr_curve"):  # (as JSON holds them: rows compare equal)
            row[curve] = [list(point) for point in row[curve]]
        if kind == "epoch":
            p.start_next_epoch()
        else:
            p.start_next_interval()
            self._clock, self._samples_timed = time.perf_counter(), 0
        best = (self.best.metric, values[self.best.metric]) if is_best else None
        self._validated_at = p.global_step
        due = self._validation_checkpoint_due(is_best)
        if not due:
            row["checkpoint"] = None  # (its row goes with the next checkpoint, whichever kind)
            self.checkpointer.totals.skipped += 1
        self.metrics.append(row)
        self.control.on_epoch(row)
        if due:
            self._checkpoint(kind, mandatory=True, best=best, with_metrics=True)
            self._committed_at = p.global_step

    def _validation_checkpoint_due(self, is_best: bool) -> bool:
        """Whether this validation is checkpointed: at a new best, the run's end, a pause, a stop, or not within
        ``checkpoint.min_interval_s`` of the last checkpoint taken on any rank. Every rank makes the same two
        collectives, whatever its own view (a user's metric may differ by rank)."""
        if not self._spacing.min_interval_s:
            return True
        stop = self.control.stop_reason() is not None
        must = is_best or self.finished() or self._pause_due() is not None
        soon = self._spacing.too_soon() and not failpoints.held()  # (a test holding commits has every one taken)
        soon_anywhere, must_anywhere = self.layout.sum_over_ranks(float(soon), float(must))
        return stop or bool(must_anywhere) or not soon_anywhere

    # --- where a step falls ----------------------------------------------------------------
    def _group(self) -> tuple[int, int]:
        """(position of the coming micro-batch in its accumulation group, the group's size)."""
        p, accum, n = self.progress, self.parts.spec.loop.grad_accum_steps, self._pass_length()
        if n is None:  # a stream: fixed-size groups, continuing across passes
            return p.micro_step % accum, accum
        group_start = (p.batch_in_epoch // accum) * accum
        return p.batch_in_epoch - group_start, min(accum, n - group_start)

    def _pass_length(self) -> Optional[int]:
        """Batches in the current pass (None: a stream's, unknown); fewer in a resharded resume's first
        pass, whose first samples were consumed in batches of another size."""
        offset, data = self.progress.epoch_sample_offset, self.parts.data
        if offset and not isinstance(data, StreamPlan):  # (a stream is never resumed resharded)
            return data.pass_batches(offset)
        return data.batches_per_pass

    def _pass_complete(self) -> bool:
        n = self._pass_length()
        return self._exhausted if n is None else self.progress.batch_in_epoch >= n

    def _validation_due(self) -> bool:
        loop, step = self.parts.spec.loop, self.progress.global_step
        if loop.max_steps is not None and step == loop.max_steps:
            return True
        if loop.eval_every_steps is None or step % loop.eval_every_steps:
            return False
        return not self._epoch_end_follows()

    def _epoch_end_follows(self) -> bool:
        """Whether this step ends an epoch of an epoch-based run: its validation and checkpoint
        come moments later, so neither is taken here."""
        n = self._pass_length()
        return self.parts.spec.loop.epochs is not None and n is not None and self.progress.batch_in_epoch >= n

    def _pause_due(self) -> Optional[str]:
        """"paused" at the validation that reaches ``pause_at`` (here, or at the epoch's end moments later),
        unless the run ends there: a pause reuses that validation's checkpoint."""
        p = self.progress
        if self.pause_at is None or self.finished():
            return None
        if self._epoch_end_follows():
            return "paused" if self._reached(p.epoch + 1) else None
        return "paused" if self._validated_at == p.global_step and self._reached(p.epoch) else None

    def _reached(self, epochs_done: int) -> bool:
        """Whether ``pause_at`` is reached: in epochs done for an epoch-based run, in steps for a step-based one."""
        done = epochs_done if self.parts.spec.loop.epochs is not None else self.progress.global_step
        return self.pause_at is not None and done >= self.pause_at

    def _paused_here(self) -> bool:
        """Whether the loop resumed from the checkpoint of a validation that reaches ``pause_at`` (an attempt
        lost after that checkpoint's commit, before its pause was recorded)."""
        p = self.progress
        return bool(self.metrics) and self.metrics[-1]["step"] == p.global_step and self._reached(p.epoch)

    # --- checkpoints -----------------------------------------------------------------------
    def _periodic_checkpoint(self) -> None:
        every = self.parts.spec.checkpoint.every_steps
        p = self.progress
        if not every or p.global_step % every or self._validated_at == p.global_step or self._epoch_end_follows():
            return
        self._checkpoint("step", mandatory=False)

    def _memory_copy(self) -> None:
        """The state in host memory when one is due (not at an epoch's last step: its validation and
        durable checkpoint come moments later)."""
        p = self.progress
        if self.memory is None or not self.memory.due(p.global_step) or self._epoch_end_follows():
            return
        self._absorb_readings()  # the running sums travel in the copy
        stable = train_state.stable_storages(self.parts) if self.parts.device.type == "cuda" else None
        self.memory.take(lambda: train_state.capture(self.parts, p, self.best, self.metrics, self.cpu_threads),
                         p.global_step, p.epoch, p.batch_in_epoch, stable)

    def _stop(self, reason: str) -> Outcome:
        self._checkpoint("stop", mandatory=True)
        self._committed_at = self.progress.global_step
        self.checkpointer.wait()
        return Outcome(completed=False, reason=reason, step=self.progress.global_step)

    def _checkpoint(self, kind: str, mandatory: bool, best=None, with_metrics: bool = False) -> None:
        p = self.progress
        self._absorb_readings()  # the running sums travel in the checkpoint
        with_metrics = with_metrics or len(self.metrics) > self._rows_committed  # (rows of a skipped validation)
        request = CheckpointRequest(
            step=p.global_step, epoch=p.epoch, batch_in_epoch=p.batch_in_epoch, kind=kind, best=best,
            metrics_rows=list(self.metrics) if with_metrics else None,
        )
        stable = train_state.stable_storages(self.parts) if self.parts.device.type == "cuda" else None
        weights = self.checkpointer.captures_weights  # False: it takes them as shards
        if self.checkpointer.save(lambda: train_state.capture(self.parts, p, self.best, self.metrics, self.cpu_threads,
                                                              weights), request, mandatory=mandatory, stable=stable):
            self._spacing.taken()
            self._rows_committed = len(self.metrics) if with_metrics else self._rows_committed

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

    def _where(self) -> str:
        """Where the loop is, for people: epochs, steps and batches counted from 1."""
        p = self.progress
        unit = "epoch" if self.parts.spec.loop.epochs is not None else "pass over the data"
        if self._validating:
            return f"while validating after step {p.global_step} ({unit} {p.epoch + 1})"
        return f"while training step {p.global_step + 1} ({unit} {p.epoch + 1}, its batch {p.batch_in_epoch + 1})"

    # --- small readings --------------------------------------------------------------------
    def _train_loss(self) -> float:
        """The training loss per sample since the last validation (over every rank's samples)."""
        loss_sum, samples = self.layout.sum_over_ranks(self.progress.epoch_loss_sum, self.progress.epoch_samples)
        return loss_sum / samples if samples else math.nan

    def _lr(self) -> float:
        return float(self.parts.optimizer.param_groups[0]["lr"])

    def _throughput(self) -> float:
        elapsed = time.perf_counter() - self._clock
        return self._samples_timed / elapsed if elapsed > 0 else 0.0
