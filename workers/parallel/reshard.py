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
  fewer steps): it is rebuilt for the steps left and placed at the same point of its decay (an
  absolute ``warmup_steps`` keeps its steps), so the learning rate continues where it was and the
  schedule ends with the run. Its new length travels in later checkpoints (``schedule_steps``), so a
  later resume, resharded again or not, rebuilds the same schedule. Per-epoch schedules and
  step-based runs (``loop.max_steps``) keep theirs as saved.

The run is not bit-exact with one that kept its count of ranks (other global batches, other rounding),
and says so: the log, the manifest's ``reshards`` and the report.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

from baton.schemas.errors import PermanentError
from baton.schemas.manifest import CheckpointEntry, Reshard
from baton.workers.training import rng
from baton.workers.training.components import Components
from baton.workers.training.data import DataPlan, derive_seed, pass_batches
from baton.workers.training.progress import Progress
from baton.workers.training.sharding import ShardedPlan
from baton.workers.training.streams import StreamPlan

from baton.workers.parallel.distributed import written_by


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


def _map_style(parts: Components) -> "DataPlan | ShardedPlan":
    """The components' data, which a resharded resume needs map-style (a stream cannot be sharded over ranks)."""
    if isinstance(parts.data, StreamPlan):
        raise PermanentError("a resharded resume needs a map-style data set")
    return parts.data


def steps_left(parts: Components, progress: Progress) -> int:
    """Optimizer steps left in an epoch-based run from ``progress``, at this rank count."""
    spec, accum, data = parts.spec, parts.spec.loop.grad_accum_steps, _map_style(parts)
    epochs = spec.loop.epochs or 0  # (an epoch-based run's)
    return (-(-data.pass_batches(progress.epoch_sample_offset) // accum)
            + (epochs - progress.epoch - 1) * -(-data.pass_batches() // accum))


def refit_schedule(parts: Components, progress: Progress, old_world: int) -> None:
    """Rebuild a per-step schedule of an epoch-based run for the steps left at the new rank count, at
    the same point of its decay (an absolute warmup keeps its steps), ending with the run; the saved
    schedule (loaded into ``parts``) says where it was and how long it was."""
    spec = parts.spec
    if parts.scheduler is None or not spec.scheduler.per_step or spec.loop.max_steps is not None:
        return
    accum, left = spec.loop.grad_accum_steps, steps_left(parts, progress)
    at = parts.scheduler.last_epoch
    length = parts.schedule_steps  # None: written before schedules were refit, at the old count's length
    if length is None:
        length = (spec.loop.epochs or 0) * -(-pass_batches(_map_style(parts).train_samples,
                                                            spec.data.batch_size * old_world) // accum)
    warmup = spec.scheduler.warmup_steps if spec.scheduler.name in ("warmup_cosine", "constant_warmup") else None
    warmup = warmup or 0  # a warmup given as a fraction of the run scales with it
    if left == 0 or at >= length:
        return  # nothing left to schedule
    if at < warmup:
        position = at  # still warming up: the same step of the same warmup
    else:
        decayed = (at - warmup) / (length - warmup)
        position = warmup + round(decayed * left / (1.0 - decayed))  # (position - warmup) / (total - warmup) == decayed
    parts.rebuild_schedule(position + left)
    with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": placing it, not stepping
        warnings.simplefilter("ignore", UserWarning)
        parts.scheduler.last_epoch = position - 1
        parts.scheduler.step()


def restore_resharded(parts: Components, rank: int, owns: list[dict[str, Any]]) -> Progress:
    """This rank's loop position and RNG from a checkpoint written by another number of ranks, whose
    own states are ``owns`` (by old rank); the model, optimizer, scheduler, best tracker and rows
    are loaded already."""
    if parts.data.state_dict() is not None:  # (a stream cannot be sharded over ranks at all)
        raise PermanentError("a resharded resume needs a map-style data set")
    progress = progress_for(owns, rank, _map_style(parts).train_samples, parts.spec.data.batch_size)
    if parts.spec.loop.max_steps is None:  # the run's length in steps changes with the global batch
        parts.run_steps = progress.global_step + steps_left(parts, progress)
    refit_schedule(parts, progress, len(owns))
    restore_rng(owns, parts, rank, progress.global_step)
    return progress



def resharding_of(state: Optional[dict[str, Any]], entry: Optional[CheckpointEntry], world_size: int,
                  allowed: bool, attempt: int) -> Optional[Reshard]:
    """Whether resuming ``state`` (from ``entry``) on ``world_size`` ranks reshards it: a sharded
    checkpoint written by another number of ranks, where ``resources.reshard`` allows it (PermanentError
    where not); any other checkpoint resumes only on the count that wrote it."""
    from baton.workers.parallel.distributed import check_same_processes
    from baton.storage.checkpoint_io import SHARDS_KEY

    if state is None or SHARDS_KEY not in state:
        check_same_processes(state, world_size)
        return None
    check_reshard(state, world_size, allowed)
    if written_by(state) == world_size or entry is None:
        return None
    return Reshard(step=entry.step, from_ranks=written_by(state), to_ranks=world_size, attempt=attempt)
