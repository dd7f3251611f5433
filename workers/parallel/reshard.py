"""Resuming a sharded job on another number of ranks (``resources.reshard``).

DCP reshards the model's and the optimizer's state as it loads them (``sharded_state.restore``): every
tensor comes back exact, cut for the new ranks. What belonged to the old ranks is mapped here:

- **The data position** becomes global samples consumed: the old position (a pass, and global batches
  of the old size consumed in it) is the first ``offset`` samples of that pass's order, and the new
  ranks cut the rest of that order into global batches of the new size
  (``Progress.epoch_sample_offset``). No sample of the interrupted pass is skipped or served twice;
  the next passes are whole, as ever.
- **The running sums since the last validation**: every old rank's training-loss sums go to new rank
  0 (``train_loss`` sums them over the ranks); the gradient norms, global on every rank, are rank 0's.
- **RNG**: new rank r takes old rank r's streams; a rank the old run did not have is seeded from
  (seed, step, rank).
- **A per-step learning-rate schedule of an epoch-based run** changes length (a pass has more or
  fewer steps): it is rebuilt for the steps left and placed at the same fraction of the schedule
  (the learning rate continues where it was, and the schedule ends with the run). Per-epoch schedules
  and step-based runs (``loop.max_steps``) keep theirs as saved.

The run is not bit-exact with one that kept its count of ranks (other global batches, other rounding),
and says so: the log, the manifest's ``reshards`` and the report.
"""
from __future__ import annotations

import warnings
from typing import Any

from baton.schemas.errors import PermanentError
from baton.workers.training import rng
from baton.workers.training.components import Components, build_scheduler
from baton.workers.training.data import derive_seed, pass_batches
from baton.workers.training.progress import Progress


def written_by(own: dict[str, Any]) -> int:
    """How many ranks wrote the checkpoint whose rank file ``own`` is."""
    return int(own.get("config", {}).get("processes", 1))


def check_reshard(own: dict[str, Any], processes: int, allowed: bool) -> None:
    """A sharded checkpoint on another number of ranks than the spec's: refused unless ``allowed``."""
    saved = written_by(own)
    if saved != processes and not allowed:
        raise PermanentError(
            f"resources.processes: this job's checkpoints were written by {saved} rank(s) and the spec asks for "
            f"{processes}. Set resources.processes: {saved} to resume exactly, or resources.reshard: true to load "
            f"them resharded onto {processes} rank(s) (the run is then not bit-exact with a {saved}-rank run)")


def samples_consumed(progress: Progress, train_samples: int, global_batch: int) -> int:
    """Samples of the current pass consumed at ``progress``, whose batches held ``global_batch``."""
    return min(train_samples, progress.epoch_sample_offset + progress.batch_in_epoch * global_batch)


def progress_for(owns: list[dict[str, Any]], rank: int, train_samples: int, batch_size: int) -> Progress:
    """New rank ``rank``'s progress from the old ranks' own states (``owns``, by old rank)."""
    old = [Progress.from_state(own["progress"]) for own in owns]
    first = old[0]
    consumed = samples_consumed(first, train_samples, batch_size * len(owns))
    progress = Progress.from_state(first.state_dict())
    progress.batch_in_epoch, progress.epoch_sample_offset = 0, consumed
    if rank == 0:
        progress.epoch_loss_sum = sum(p.epoch_loss_sum for p in old)
        progress.epoch_samples = sum(p.epoch_samples for p in old)
    else:
        progress.epoch_loss_sum, progress.epoch_samples = 0.0, 0
    return progress


def restore_rng(owns: list[dict[str, Any]], parts: Components, rank: int, step: int) -> None:
    if rank < len(owns):
        rng.restore(owns[rank]["rng"], parts.device)
    else:
        rng.seed_all(derive_seed(parts.spec.seed, "reshard", step, rank))


def refit_schedule(parts: Components, progress: Progress, old_world: int) -> None:
    """Rebuild a per-step schedule of an epoch-based run for the steps left at the new rank count, at
    the same fraction of the schedule as the saved one (see the module's docstring)."""
    spec = parts.spec
    if parts.scheduler is None or not spec.scheduler.per_step or spec.loop.max_steps is not None:
        return
    accum = spec.loop.grad_accum_steps
    old_pass = pass_batches(parts.data.train_samples, spec.data.batch_size * old_world)
    old_total = spec.loop.epochs * -(-old_pass // accum)
    done = progress.global_step
    left = (-(-parts.data.pass_batches(progress.epoch_sample_offset) // accum)
            + (spec.loop.epochs - progress.epoch - 1) * -(-parts.data.batches_per_pass // accum))
    fraction = done / old_total
    position = round(fraction * left / (1.0 - fraction))  # position / (position + left) == fraction
    scheduler = build_scheduler(parts.optimizer, spec.scheduler, spec.optimizer.lr, spec.loop.epochs, position + left)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": placing it, not stepping
        warnings.simplefilter("ignore", UserWarning)
        scheduler.last_epoch = position - 1
        scheduler.step()
    parts.scheduler = scheduler
    parts.run_steps = done + left


def restore_resharded(parts: Components, rank: int, owns: list[dict[str, Any]]) -> Progress:
    """This rank's loop position and RNG from a checkpoint written by another number of ranks, whose
    own states are ``owns`` (by old rank); the model, optimizer, scheduler, best tracker and rows
    are loaded already."""
    if parts.data.state_dict() is not None:  # (a stream cannot be sharded over ranks at all)
        raise PermanentError("a resharded resume needs a map-style data set")
    progress = progress_for(owns, rank, parts.data.train_samples, parts.spec.data.batch_size)
    refit_schedule(parts, progress, len(owns))
    restore_rng(owns, parts, rank, progress.global_step)
    return progress

