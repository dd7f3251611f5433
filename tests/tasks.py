"""User code for the task tests: a task reading dict batches, data sets that yield them, a stream
with state_dict(), and tasks that break the protocol. Imported by jobs as ``tests.tasks:NAME``."""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset, get_worker_info
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassF1Score

from baton.workers.training.data import derive_seed

# (method, model.training, torch.is_grad_enabled()) for every call a DictTask receives in this process
CALLS: list[tuple[str, bool, bool]] = []


def _blob(seed: int, index: int) -> dict:
    g = torch.Generator().manual_seed(derive_seed(seed, "blob", index))
    label = int(torch.randint(0, 3, (), generator=g))
    centre = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])[label]
    return {"features": centre + torch.randn(2, generator=g), "label": torch.tensor(label)}


class DictBlobs(Dataset):
    """Three Gaussian blobs as {"features": (2,), "label": ()} samples."""

    def __init__(self, n: int = 300, seed: int = 0, offset: int = 0, delay_s: float = 0.0):
        self.n, self.seed, self.offset, self.delay_s = n, seed, offset, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        if self.delay_s:
            time.sleep(self.delay_s)
        return _blob(self.seed, self.offset + index)


def dict_blobs(n: int = 300, seed: int = 0, offset: int = 0, delay_s: float = 0.0) -> Dataset:
    """``delay_s`` paces loading (seconds a sample), as real data is: a test polling a run needs time."""
    return DictBlobs(n, seed, offset, delay_s)


class BlobStream(IterableDataset):
    """An endless-looking stream of ``n`` dict blobs in a per-epoch order; its position is its state.

    Each sample also gets noise from a generator seeded by (seed, epoch, index): a stream's
    randomness must come from its own state, never a loader worker's global RNG.
    """

    def __init__(self, n: int = 400, seed: int = 0, delay_s: float = 0.0):
        self.n, self.seed, self.epoch, self.position, self.delay_s = n, seed, 0, 0, delay_s

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(derive_seed(self.seed, self.epoch)))
        mine = order.tolist()[worker::workers]
        while self.position < len(mine):
            index = mine[self.position]
            self.position += 1
            if self.delay_s:
                time.sleep(self.delay_s)
            sample = _blob(self.seed, index)
            noise = torch.Generator().manual_seed(derive_seed(self.seed, "noise", self.epoch, index))
            sample["features"] = sample["features"] + 0.1 * torch.randn(2, generator=noise)
            yield sample

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def blob_stream(n: int = 400, seed: int = 0, delay_s: float = 0.0) -> IterableDataset:
    return BlobStream(n, seed, delay_s)


class NumpyStateStream(BlobStream):
    """BlobStream counting in numpy scalars, as numpy-based data code does: its position and epoch are
    numpy.int64, and its state also carries a numpy.float32. Its load_state_dict takes them back only
    as the very types it gave (it relies on numpy's arithmetic, not Python's)."""

    def __init__(self, n: int = 400, seed: int = 0):
        super().__init__(n, seed)
        self.epoch, self.position, self.noise = np.int64(0), np.int64(0), np.float32(0.1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = np.int64(epoch), np.int64(0)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "noise": self.noise}

    def load_state_dict(self, state: dict) -> None:
        for name, kind in (("epoch", np.int64), ("position", np.int64), ("noise", np.float32)):
            if type(state[name]) is not kind:
                raise TypeError(f"state[{name!r}] is a {type(state[name]).__name__}, not a {kind.__name__}")
        self.epoch, self.position, self.noise = state["epoch"], state["position"], state["noise"]


def numpy_state_stream(n: int = 400, seed: int = 0) -> IterableDataset:
    return NumpyStateStream(n, seed)


class NumpyGeneratorStream(BlobStream):
    """Keeps a numpy Generator object itself in its state (torch.load(weights_only=True) refuses it)."""

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": np.random.default_rng(self.seed)}


def numpy_generator_stream(n: int = 400, seed: int = 0) -> IterableDataset:
    return NumpyGeneratorStream(n, seed)


class StreamWithoutState(IterableDataset):
    def __iter__(self):
        for i in range(100):
            yield _blob(0, i)


def stream_without_state() -> IterableDataset:
    return StreamWithoutState()


class DictTask:
    """Cross-entropy on batch["features"] -> batch["label"]; validation reports macro F1 and loss."""

    def __init__(self, classes: int = 3):
        self.classes = classes

    def loss(self, model: nn.Module, batch: dict) -> torch.Tensor:
        CALLS.append(("loss", model.training, torch.is_grad_enabled()))
        return F.cross_entropy(model(batch["features"]), batch["label"])

    def metrics(self) -> dict:
        return {"f1": MulticlassF1Score(num_classes=self.classes, average="macro"),
                "loss": MeanMetric().set_dtype(torch.float64)}

    def score(self, model: nn.Module, batch: dict, metrics: dict) -> None:
        CALLS.append(("score", model.training, torch.is_grad_enabled()))
        logits = model(batch["features"])
        metrics["f1"].update(logits.argmax(dim=1), batch["label"])
        metrics["loss"].update(F.cross_entropy(logits, batch["label"], reduction="none"))


def dict_task(classes: int = 3) -> DictTask:
    return DictTask(classes)


class NonScalarLoss(DictTask):
    def loss(self, model, batch):
        return F.cross_entropy(model(batch["features"]), batch["label"], reduction="none")


class NotAMetric(DictTask):
    def metrics(self) -> dict:
        return {"f1": lambda preds, target: 0.0}


class NanLoss(DictTask):
    def loss(self, model, batch):
        return model(batch["features"]).sum() * float("nan")


def non_scalar_loss() -> DictTask:
    return NonScalarLoss()


def not_a_metric() -> DictTask:
    return NotAMetric()


def nan_loss() -> DictTask:
    return NanLoss()


def pairs_to_dicts(samples: list, scale: float = 1.0) -> dict:
    """A user collate: (input, label) samples -> {"features", "label"} batches (kwargs bound by baton)."""
    return {"features": torch.stack([x for x, _ in samples]) * scale, "label": torch.stack([y for _, y in samples])}
