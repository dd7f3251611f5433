"""The data pipeline's reproducibility: a seeded split, per-epoch shuffles, index-based resume.

- The train/validation split is a permutation seeded by the job's seed alone.
- Each epoch's shuffle is drawn from a generator seeded by (seed, epoch), so the data position
  is just (epoch, batches consumed): no generator state has to travel in a checkpoint.
- Resuming mid-epoch skips the consumed batches by index: they are never loaded.
- Augmentation draws from a generator seeded by (seed, epoch, sample index), so it does not
  depend on which loader worker loads a sample, or on how many there are.
- Every DataLoader gets its own generator, so creating an iterator never draws from the global
  RNG (which dropout uses).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from schemas.spec import DataSpec


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts, stable across processes and Python versions."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) index lists, each sorted; validation gets ``ceil(n * val_fraction)`` samples."""
    n_val = max(1, math.ceil(n * val_fraction))
    if n_val >= n:
        raise ValueError(f"data set of {n} samples is too small for val_fraction {val_fraction}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, "split")))
    return sorted(perm[n_val:].tolist()), sorted(perm[:n_val].tolist())


class TrainView(Dataset):
    """The training split of ``base`` in one epoch, with per-sample seeded augmentation."""

    def __init__(self, base: Dataset, indices: list[int], seed: int, epoch: int):
        self.base, self.indices, self.seed, self.epoch = base, indices, seed, epoch
        self._augment = getattr(base, "augment", None)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int):
        index = self.indices[position]
        x, y = self.base[index]
        if self._augment is not None:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "augment", self.epoch, index))
            x = self._augment(x, generator)
        return x, y


class EvalView(Dataset):
    def __init__(self, base: Dataset, indices: list[int]):
        self.base, self.indices = base, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int):
        return self.base[self.indices[position]]


class EpochBatches(Sampler[list[int]]):
    """The batches of one epoch's shuffle, starting at batch ``start``."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int, start: int = 0):
        self.n, self.batch_size, self.seed, self.epoch, self.start = n, batch_size, seed, epoch, start

    @property
    def total(self) -> int:
        return math.ceil(self.n / self.batch_size)

    def __len__(self) -> int:
        return max(0, self.total - self.start)

    def __iter__(self):
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "shuffle", self.epoch))
        order = torch.randperm(self.n, generator=generator).tolist()
        for b in range(self.start, self.total):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]


@dataclass
class DataPlan:
    """Builds the loaders of a job; nothing in it changes as training runs."""

    base: Dataset
    spec: DataSpec
    seed: int
    train_indices: list[int]
    val_indices: list[int]
    pin_memory: bool = False

    @classmethod
    def build(cls, base: Dataset, spec: DataSpec, seed: int, pin_memory: bool = False) -> "DataPlan":
        train, val = split_indices(len(base), spec.val_fraction, seed)
        return cls(base, spec, seed, train, val, pin_memory)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.train_indices) / self.spec.batch_size)

    def _loader(self, dataset: Dataset, batches: Sampler, generator_seed: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=self.spec.num_workers,
            pin_memory=self.pin_memory,
            generator=torch.Generator().manual_seed(generator_seed),
        )

    def train_loader(self, epoch: int, start_batch: int = 0) -> DataLoader:
        view = TrainView(self.base, self.train_indices, self.seed, epoch)
        batches = EpochBatches(len(view), self.spec.batch_size, self.seed, epoch, start_batch)
        return self._loader(view, batches, derive_seed(self.seed, "loader", epoch))

    def val_loader(self) -> DataLoader:
        view = EvalView(self.base, self.val_indices)
        size = self.spec.val_batch_size or self.spec.batch_size
        batches = [list(range(i, min(i + size, len(view)))) for i in range(0, len(view), size)]
        return self._loader(view, batches, derive_seed(self.seed, "val-loader"))
