"""One rank's share of a map-style data set in a data-parallel job (``resources.processes``).

``data.batch_size`` is per rank. Every pass's order is drawn identically on every rank from the
seed and cut into global batches of N x batch_size; rank r takes its contiguous share of each.
The data position stays (epoch, global batches consumed) and a resumed rank skips consumed
batches by index. A resharded resume (another number of ranks) turns the position into global
samples consumed (``Progress.epoch_sample_offset``): the rest of that epoch's order is cut into the
new global batches, so no sample is skipped or served twice. Validation samples are split into N contiguous shards; the task's torchmetrics
metrics sum their states over ranks on ``compute()``, so validation stays per sample over the
whole set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from baton.schemas.errors import PermanentError

from baton.workers.training.data import DataPlan, EpochBatches, TrainView, derive_seed, pass_batches


def share(batch: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s contiguous share of one global batch (sizes differ by at most one). A short
    last batch with fewer samples than ranks gives the ranks without a share one sample of it again
    (as DistributedSampler pads), so every rank has a batch to step on."""
    base, extra = divmod(len(batch), world_size)
    start = rank * base + min(rank, extra)
    mine = batch[start:start + base + (1 if rank < extra else 0)]
    return mine if mine else batch[rank % len(batch):rank % len(batch) + 1]


def shard_range(n: int, rank: int, world_size: int) -> range:
    """Rank ``rank``'s contiguous part of ``n`` items (sizes differ by at most one)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


class RankBatches(EpochBatches):
    """This rank's share of every global batch of one epoch, from global batch ``start``."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int, start: int, rank: int, world_size: int,
                 offset: int = 0):
        super().__init__(n, batch_size * world_size, seed, epoch, start, offset)
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        for batch in super().__iter__():
            yield share(batch, self.rank, self.world_size)


@dataclass
class ShardedPlan:
    """A map-style plan as one rank sees it: the same passes, in global batches, its share of each."""

    plan: DataPlan
    rank: int
    world_size: int

    @property
    def global_batch_size(self) -> int:
        return self.plan.loading.spec.batch_size * self.world_size

    @property
    def train_samples(self) -> int:
        return self.plan.train_samples

    @property
    def batches_per_pass(self) -> Optional[int]:
        return self.pass_batches()

    def pass_batches(self, sample_offset: int = 0) -> int:
        return pass_batches(self.train_samples, self.global_batch_size, sample_offset)

    def train_batches(self, epoch: int, start_batch: int = 0, sample_offset: int = 0):
        plan, seed = self.plan, self.plan.loading.seed
        view = TrainView(plan.base, plan.train_indices, seed, epoch)
        batches = RankBatches(len(view), plan.loading.spec.batch_size, seed, epoch, start_batch, self.rank,
                              self.world_size, sample_offset)
        loader_seed = derive_seed(seed, "loader", epoch) if self.rank == 0 else derive_seed(seed, "loader", epoch, self.rank)
        return plan.loading.loader(view, loader_seed, batch_sampler=batches)

    def end_pass(self) -> None:
        self.plan.end_pass()

    def val_loader(self):
        plan = self.plan
        indices = plan.val_indices if plan.val_indices is not None else list(range(len(plan.val_set)))
        if len(indices) < self.world_size:
            raise PermanentError(f"resources.processes: {self.world_size} ranks need at least as many validation "
                                 f"samples; there are {len(indices)}")
        mine = [indices[i] for i in shard_range(len(indices), self.rank, self.world_size)]
        return plan.loading.val_loader(plan.val_set, mine)

    def state_dict(self) -> Optional[dict]:
        return self.plan.state_dict()

    def load_state_dict(self, state: Optional[dict]) -> None:
        self.plan.load_state_dict(state)
