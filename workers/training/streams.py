"""Iterable (streaming) training data, whose position is restored through ``state_dict()``.

A stream has no indices to skip by, so its position is the loader's own state: torchdata's
``StatefulDataLoader`` asks the data set (in each loader worker) for ``state_dict()`` alongside
every batch, and on resume hands it back through ``load_state_dict()``, together with which
worker yields next and the workers' base seed. That is exact for any ``num_workers``, provided
the data set keeps everything that decides what it yields next in its state (a stream that
draws from a worker's global RNG cannot be replayed: keep a ``torch.Generator`` in the state).

Each pass iterates a fresh copy of the data set as built (as a loader worker would), after
``set_epoch(epoch)`` if it has one. A stream's length is unknown, so a job on one is step-based
(``loop.max_steps``) and validates on ``data.val``. Gradient accumulation groups continue across
the end of a pass.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from baton.schemas.errors import PermanentError

from baton.workers.training.data import Loading, derive_seed
from baton.workers.training.stream_state import from_checkpoint, to_checkpoint


@dataclass
class StreamPlan:
    base: IterableDataset
    loading: Loading
    val_set: Dataset
    _loader: Optional[StatefulDataLoader] = field(default=None, repr=False)
    _resume_state: Optional[dict] = field(default=None, repr=False)

    @classmethod
    def build(cls, base: IterableDataset, loading: Loading, val_base: Optional[Dataset], max_steps: Optional[int]) -> "StreamPlan":
        missing = []
        if max_steps is None:
            missing.append("loop.max_steps (a stream's length is unknown, so epochs cannot be counted)")
        if val_base is None:
            missing.append("data.val (a stream cannot be split by index)")
        if missing:
            raise PermanentError(f"data target {loading.spec.target} is an IterableDataset; it needs " + " and ".join(missing))
        for method in ("state_dict", "load_state_dict"):
            if not callable(getattr(base, method, None)):
                raise PermanentError(
                    f"data target {loading.spec.target} is an IterableDataset without {method}(): its position could "
                    "not be restored after an interruption; implement state_dict() and load_state_dict()")
        return cls(base, loading, val_base)

    @property
    def batches_per_pass(self) -> Optional[int]:
        return None

    def train_batches(self, epoch: int, start_batch: int = 0, sample_offset: int = 0) -> StatefulDataLoader:
        """(``sample_offset`` is a map-style plan's; a stream's position is its loader state.)"""
        dataset = copy.deepcopy(self.base)
        if callable(getattr(dataset, "set_epoch", None)):
            dataset.set_epoch(epoch)
        with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in newer torch
            warnings.filterwarnings("ignore", message=".*set_vital.*", category=UserWarning)
            self._loader = self._make_loader(dataset, epoch)
        if self._resume_state is not None:
            self._loader.load_state_dict(self._resume_state)
            self._resume_state = None
        return self._loader

    def _make_loader(self, dataset: IterableDataset, epoch: int) -> StatefulDataLoader:
        return StatefulDataLoader(
            dataset, batch_size=self.loading.spec.batch_size, num_workers=self.loading.spec.num_workers,
            collate_fn=self.loading.collate, pin_memory=self.loading.pin_memory,
            generator=torch.Generator().manual_seed(derive_seed(self.loading.seed, "loader", epoch)),
        )

    def end_pass(self) -> None:
        self._loader = None  # the next pass starts from the beginning of a fresh copy

    def val_loader(self):
        return self.loading.val_loader(self.val_set)

    def state_dict(self) -> Optional[dict[str, Any]]:
        """The loader's position after the last batch it yielded (None before a pass starts), fit for
        a checkpoint (``stream_state.py``: numpy values stored exactly, unloadable ones refused)."""
        if self._loader is None:
            return None
        return to_checkpoint(self._loader.state_dict(), self.loading.spec.target)

    def load_state_dict(self, state: Optional[dict[str, Any]]) -> None:
        self._resume_state = from_checkpoint(state)
