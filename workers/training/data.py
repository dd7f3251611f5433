"""The data pipeline's reproducibility: a seeded split, per-epoch shuffles, index-based resume.

- The train/validation split is a permutation seeded by the job's seed alone.
- Each epoch's shuffle is drawn from a generator seeded by (seed, epoch), so the data position
  is just (epoch, batches consumed): no generator state has to travel in a checkpoint.
- Resuming mid-epoch skips the consumed batches by index: they are never loaded.
- Augmentation draws from a generator seeded by (seed, epoch, sample index), so it does not
  depend on which loader worker loads a sample, or on how many there are.
- In a loader worker process, python's, numpy's and torch's global RNGs are seeded from (seed,
  epoch, sample index) before every ``__getitem__`` (validation samples: from (seed, index)), so randomness a data set draws there (outside
  ``augment()``) is reproduced by a mid-epoch resume and does not depend on the number of loader
  workers. Not in the main process (``num_workers: 0``): there those draws come from the global
  stream dropout uses, which every checkpoint carries, so resume is exact already, and re-seeding
  would change that stream (saving and restoring it around each sample costs ~0.3 ms).
- Every DataLoader gets its own generator, so creating an iterator never draws from the global
  RNG (which dropout uses).
- A separate validation set (``data.val``) replaces the split; the whole data set then trains.

Iterable (streaming) data sets are planned by ``baton.workers.training.streams``; both plans offer the loop the
same small interface: ``batches_per_pass`` (None when unknown), ``train_batches``, ``end_pass``,
``val_loader``, and ``state_dict``/``load_state_dict`` for a position that is more than indices.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, TensorDataset, get_worker_info

from baton.schemas.spec import DataSpec


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


def seed_sample_rngs(seed: int, epoch: int, index: int) -> None:
    """Seed python's, numpy's and torch's (CPU) global RNGs for one sample: call only in a loader
    worker process, whose global RNGs nothing else reads."""
    value = derive_seed(seed, "sample", epoch, index)
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.random.default_generator.manual_seed(value)


UNGATHERED_DTYPES = (torch.uint16, torch.uint32, torch.uint64)
"""``index_select`` has no CPU kernel for these (1-D); their data sets load sample by sample."""


def tensor_columns(base: Dataset) -> Optional[tuple[torch.Tensor, ...]]:
    """The tensors of a data set whose sample ``i`` is ``tuple(t[i] for t in tensors)``: torch's
    ``TensorDataset``, or a subclass that keeps its ``__getitem__``, of dense tensors that
    ``index_select`` takes (``default_collate`` refuses sparse ones). None for any other."""
    if not isinstance(base, TensorDataset) or type(base).__getitem__ is not TensorDataset.__getitem__:
        return None
    columns = base.tensors
    if any(t.layout != torch.strided or t.dtype in UNGATHERED_DTYPES for t in columns):
        return None
    return columns


def add_note(exc: BaseException, note: str) -> None:
    """Say where an exception happened, beside its message (Python 3.11's notes; printed with its traceback)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)


class SplitView(Dataset):
    """What the training and validation views share: samples ``indices`` of ``base``, nothing to
    augment unless a subclass says so, and the two faster ways to a batch. A data set's exception
    is noted with the index of the sample it failed on."""

    _augment: Optional[Callable] = None
    kind = "data"

    def __init__(self, base: Dataset, indices: list[int], seed: int = 0):
        self.base, self.indices, self.seed = base, indices, seed

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, positions: list[int]) -> list:
        """One batch's samples (the DataLoader's fetcher calls it once per batch). With nothing to
        augment, in the main process: straight from the base data set; in a loader worker
        ``__getitem__`` sample by sample, which seeds each sample's RNGs."""
        if self._augment is None and get_worker_info() is None:
            base, indices = self.base, self.indices
            index = None
            try:
                return [base[(index := indices[p])] for p in positions]
            except Exception as exc:
                add_note(exc, f"while loading sample {index} of the {self.kind} set (its index in your data set)")
                raise
        return [self[p] for p in positions]

    def tensor_batches(self) -> Optional["TensorBatches"]:
        """This view gathered a batch at a time, where its base is a TensorDataset and nothing is augmented."""
        columns = tensor_columns(self.base) if self._augment is None else None
        return TensorBatches(self, columns) if columns is not None else None


class TensorBatches(Dataset):
    """A view of a ``TensorDataset`` whose ``__getitems__`` returns the whole batch: one indexing of
    each tensor instead of a ``__getitem__`` per sample and the default collate's stack (~0.1 ms a
    batch of 64 on the CPU). The values, dtypes and shapes are the default collate's: a list with
    one stacked tensor per column. Its loader's collate passes the batch on as it is."""

    def __init__(self, view: SplitView, columns: tuple[torch.Tensor, ...]):
        self.view, self.columns = view, columns
        self._indices = np.asarray(view.indices, dtype=np.int64)  # positions to rows, mapped in one indexing

    def __len__(self) -> int:
        return len(self.view)

    def __getitem__(self, position: int):
        return self.view[position]

    def __getitems__(self, positions: list[int]) -> list[torch.Tensor]:
        index = torch.from_numpy(self._indices[np.asarray(positions, dtype=np.int64)])
        batch = []  # (the index from numpy: a third of torch.tensor(list)'s time)
        for column in self.columns:
            if column.device != index.device:  # a data set held on a GPU: the index moves there once
                index = index.to(column.device)
            batch.append(column.index_select(0, index))
        return batch


class GatheredLoader:
    """The batches a worker-less, unpinned DataLoader of a ``TensorBatches`` gives (the same lists of
    tensors, in the batch sampler's order), without its per-batch machinery: the fetcher, the
    profiler's record_function, the pinning checks (~40 us a batch, a few per cent of a small model's
    step). Its iterator draws nothing from any generator (a DataLoader's draws from its own only)."""

    def __init__(self, dataset: TensorBatches, batch_sampler: Iterable[list[int]]):
        self.dataset, self.batch_sampler = dataset, batch_sampler  # (a DataLoader's names for them)

    def __len__(self) -> int:
        return len(self.batch_sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        for positions in self.batch_sampler:
            yield self.dataset.__getitems__(positions)


Loader = Union[DataLoader, GatheredLoader]


def whole_batch(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """The collate of a ``TensorBatches`` loader: the batch is collated already."""
    return batch


class TrainView(SplitView):
    """The training split of ``base`` in one epoch, with per-sample seeded augmentation."""

    kind = "training"

    def __init__(self, base: Dataset, indices: list[int], seed: int, epoch: int):
        super().__init__(base, indices, seed)
        self.epoch = epoch
        self._augment = getattr(base, "augment", None)

    def __getitem__(self, position: int):
        index = self.indices[position]
        if get_worker_info() is not None:  # a loader worker: its RNGs would restart from its seed on resume
            seed_sample_rngs(self.seed, self.epoch, index)
        doing = "loading"
        try:
            sample = self.base[index]
            if self._augment is None:
                return sample
            doing = "augmenting"
            generator = torch.Generator().manual_seed(derive_seed(self.seed, "augment", self.epoch, index))
            if isinstance(sample, tuple) and len(sample) == 2:  # (input, target): augment the input
                return self._augment(sample[0], generator), sample[1]
            return self._augment(sample, generator)  # any other sample is augmented whole
        except Exception as exc:
            add_note(exc, f"while {doing} sample {index} of the training set (its index in your data set)")
            raise


class EvalView(SplitView):
    """Validation samples in order; in a loader worker, the global RNGs are seeded per sample from
    (seed, index), the same for every validation."""

    kind = "validation"

    def __getitem__(self, position: int):
        index = self.indices[position]
        if get_worker_info() is not None:
            seed_sample_rngs(self.seed, -1, index)  # epoch -1: validation, never a training epoch
        try:
            return self.base[index]
        except Exception as exc:
            add_note(exc, f"while loading sample {index} of the validation set (its index in your data set)")
            raise


def pass_batches(n: int, batch_size: int, sample_offset: int = 0) -> int:
    """Batches of a pass over ``n`` samples whose first ``sample_offset`` (in its order) were consumed before."""
    return math.ceil((n - sample_offset) / batch_size)


class EpochBatches(Sampler[list[int]]):
    """The batches of one epoch's shuffle, starting at batch ``start``; with ``offset``, the shuffle's
    first ``offset`` samples were consumed before (in batches of another size: a resharded resume)
    and the batches cut the rest."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int, start: int = 0, offset: int = 0):
        self.n, self.batch_size, self.seed, self.epoch, self.start = n, batch_size, seed, epoch, start
        self.offset = offset

    @property
    def total(self) -> int:
        return pass_batches(self.n, self.batch_size, self.offset)

    def __len__(self) -> int:
        return max(0, self.total - self.start)

    def __iter__(self):
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "shuffle", self.epoch))
        order = torch.randperm(self.n, generator=generator).tolist()[self.offset:]
        for b in range(self.start, self.total):
            yield order[b * self.batch_size:(b + 1) * self.batch_size]


@dataclass
class Loading:
    """How every loader of a job is made: the spec's loader settings, collate and pinning."""

    spec: DataSpec
    seed: int
    collate: Optional[Callable[[list], Any]] = None
    pin_memory: bool = False

    def loader(self, dataset: Dataset, generator_seed: int, **kwargs) -> Loader:
        """A DataLoader of ``dataset`` with the job's settings. A view of a ``TensorDataset`` with
        nothing to augment, loaded in this process with the default collate, is gathered a whole
        batch at a time (``TensorBatches``): the same batches, fewer Python calls."""
        collate = self.collate
        if isinstance(dataset, SplitView) and collate is None and self.spec.num_workers == 0:
            batches = dataset.tensor_batches()
            if batches is not None and "batch_sampler" in kwargs and not self.pin_memory:
                return GatheredLoader(batches, kwargs["batch_sampler"])
            if batches is not None:
                dataset, collate = batches, whole_batch
        return DataLoader(dataset, num_workers=self.spec.num_workers, pin_memory=self.pin_memory,
                          collate_fn=collate, generator=torch.Generator().manual_seed(generator_seed), **kwargs)

    def val_loader(self, dataset: Dataset, indices: Optional[list[int]] = None) -> Loader:
        """The validation set in order, in batches of val_batch_size (a stream: as it comes)."""
        size = self.spec.val_batch_size or self.spec.batch_size
        seed = derive_seed(self.seed, "val-loader")
        if isinstance(dataset, IterableDataset):
            return self.loader(dataset, seed, batch_size=size)
        view = EvalView(dataset, indices if indices is not None else list(range(len(dataset))), self.seed)
        batches = [list(range(i, min(i + size, len(view)))) for i in range(0, len(view), size)]
        return self.loader(view, seed, batch_sampler=batches)


@dataclass
class DataPlan:
    """A map-style training set: its loaders; nothing in it changes as training runs."""

    base: Dataset
    loading: Loading
    train_indices: list[int]
    val_set: Dataset
    val_indices: Optional[list[int]]

    @classmethod
    def build(cls, base: Dataset, loading: Loading, val_base: Optional[Dataset] = None) -> "DataPlan":
        if val_base is not None:
            return cls(base, loading, list(range(len(base))), val_base, None)
        train, val = split_indices(len(base), loading.spec.holdout_fraction or 0.0, loading.seed)
        return cls(base, loading, train, base, val)

    @property
    def global_batch_size(self) -> int:
        return self.loading.spec.batch_size

    @property
    def train_samples(self) -> int:
        return len(self.train_indices)

    @property
    def batches_per_pass(self) -> Optional[int]:
        return self.pass_batches()

    def pass_batches(self, sample_offset: int = 0) -> int:
        return pass_batches(self.train_samples, self.global_batch_size, sample_offset)

    def train_batches(self, epoch: int, start_batch: int = 0, sample_offset: int = 0) -> Loader:
        seed = self.loading.seed
        view = TrainView(self.base, self.train_indices, seed, epoch)
        batches = EpochBatches(len(view), self.loading.spec.batch_size, seed, epoch, start_batch, sample_offset)
        return self.loading.loader(view, derive_seed(seed, "loader", epoch), batch_sampler=batches)

    def end_pass(self) -> None:
        """Nothing to do: the position is (epoch, batches consumed)."""

    def val_loader(self) -> Loader:
        return self.loading.val_loader(self.val_set, self.val_indices)

    def state_dict(self) -> Optional[dict]:
        return None  # (epoch, batch_in_epoch) in Progress is the whole position

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state is not None:
            raise ValueError("this checkpoint holds a stream's loader state; the job's data set is map-style now")
