"""Model and data targets for tests: ordinary user code that records what the loop did to it.

Specs name them as ``tests.probes:NAME`` (the tests allow the ``tests`` prefix).
"""
from __future__ import annotations

import math
import os
import time
from typing import Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from baton.workers.training.builtins.data import TensorPairs, spiral
from baton.workers.training.data import split_indices

FORWARDS: list[dict] = []
"""One entry per forward of a RecordingMLP: the mode and autograd/autocast state it ran under."""
GRAD_WAS_NONE: list[bool] = []
"""Per backward through a RecordingMLP: whether the first layer's .grad was None before accumulating."""


class RecordingMLP(nn.Module):
    def __init__(self, in_features: int = 2, hidden: int = 16, out_features: int = 3, dropout: float = 0.0):
        super().__init__()
        self.first = nn.Linear(in_features, hidden)
        self.rest = nn.Sequential(nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, out_features))
        self.first.weight.register_hook(self._before_accumulate)

    def _before_accumulate(self, grad: torch.Tensor) -> torch.Tensor:
        GRAD_WAS_NONE.append(self.first.weight.grad is None)
        return grad

    def forward(self, x):
        hidden = self.first(x)
        FORWARDS.append({"training": self.training, "grad": torch.is_grad_enabled(),
                         "dtype": hidden.dtype, "batch": len(x)})
        return self.rest(hidden)


def recording_mlp(**kwargs) -> nn.Module:
    return RecordingMLP(**kwargs)


class _CountingMLP(RecordingMLP):
    """Appends a line to ``forwards-<pid>`` in ``directory`` for each training forward: the user's own
    count of the steps it trained, across processes (a step redone after a crash is counted twice)."""

    def __init__(self, directory: str, **kwargs):
        super().__init__(**kwargs)
        self.directory = directory

    def forward(self, x):
        if self.training:
            with open(os.path.join(self.directory, f"forwards-{os.getpid()}"), "a") as out:
                out.write(f"{len(x)} {time.time():.3f}\n")
        return super().forward(x)


def counting_mlp(directory: str, **kwargs) -> nn.Module:
    return _CountingMLP(directory, **kwargs)


def forwards_counted(directory: str) -> dict[int, int]:
    """Training forwards per process, as ``counting_mlp`` recorded them."""
    counts = {}
    for name in os.listdir(directory):
        if name.startswith("forwards-"):
            with open(os.path.join(directory, name)) as records:
                counts[int(name.split("-", 1)[1])] = sum(1 for _ in records)
    return counts


def first_forward_at(directory: str) -> float:
    """When (``time.time()``) ``counting_mlp`` made its first training forward, in any process."""
    firsts = []
    for name in os.listdir(directory):
        if name.startswith("forwards-"):
            with open(os.path.join(directory, name)) as records:
                firsts.append(float(records.readline().split()[1]))
    return min(firsts)


def linear(in_features: int = 2, out_features: int = 3) -> nn.Module:
    return nn.Linear(in_features, out_features)


class _ThreadSensitive(nn.Module):
    """An MLP plus a shift computed by one long sum: torch splits a sum of over 32768 elements across its
    intra-op threads, so the shift (and every weight after the first step) rounds differently with one
    thread than with two, as a transformer's reductions do."""

    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, out_features))
        self.long = nn.Parameter(torch.linspace(-1.0, 1.0, 200_003) ** 3 / 7)

    def forward(self, x):
        return self.mlp(x) + self.long.sum() * 1e-3


def thread_sensitive(in_features: int = 2, hidden: int = 32, out_features: int = 3) -> nn.Module:
    return _ThreadSensitive(in_features, hidden, out_features)


class _Relocating(nn.Linear):
    """Moving it replaces its Parameter objects, as moving real weights to a GPU does."""

    def _apply(self, fn, recurse=True):
        self.weight = nn.Parameter(fn(self.weight.detach().clone()))
        self.bias = nn.Parameter(fn(self.bias.detach().clone()))
        return self


def relocating_linear(in_features: int = 2, out_features: int = 3) -> nn.Module:
    return _Relocating(in_features, out_features)


def blobs(seed: int = 0, n: int = 300, features: int = 2, classes: int = 3) -> Dataset:
    """Gaussian blobs: quick to learn, no augmentation."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    centers = torch.randn(classes, features, generator=gen) * 3
    return TensorPairs(centers[labels] + torch.randn(n, features, generator=gen), labels)


def diverging(seed: int = 0, n: int = 200, val_fraction: float = 0.25, delay_s: float = 0.0) -> Dataset:
    """Training samples are class 0, held-out ones class 1, inputs all alike: the more the model
    learns, the worse it validates. The best epoch is the first one. ``delay_s`` paces loading as
    ``slow_spiral`` does."""
    _, val = split_indices(n, val_fraction, seed)
    labels = torch.zeros(n, dtype=torch.long)
    labels[val] = 1
    pairs = TensorPairs(torch.ones(n, 2), labels)
    return _Slow(pairs, delay_s) if delay_s else pairs


def with_nan(seed: int = 0, n: int = 256, bad_every: int = 50, val_fraction: float = 0.25) -> Dataset:
    """Blobs with a NaN input in every ``bad_every``-th training sample (validation stays clean)."""
    base = blobs(seed, n)
    train, _ = split_indices(n, val_fraction, seed)
    inputs = base.inputs.clone()
    inputs[train[::bad_every]] = math.nan
    return TensorPairs(inputs, base.labels)


def raising(**kwargs) -> nn.Module:
    raise RuntimeError("boom from user model code")


def exiting(**kwargs) -> nn.Module:
    """User code that calls sys.exit(3) while the job starts."""
    raise SystemExit(3)


class _CancellingMLP(RecordingMLP):
    """Its 5th forward raises asyncio.CancelledError, a BaseException (as code awaiting a task may)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 5:
            import asyncio

            raise asyncio.CancelledError("cancelled inside the model")
        return super().forward(x)


def cancelling(**kwargs) -> nn.Module:
    return _CancellingMLP(**kwargs)


def eval_mode_mlp(**kwargs) -> nn.Module:
    """User code that hands over its model in eval mode: the loop must switch it to train mode."""
    return RecordingMLP(**kwargs).eval()


class _Slow(Dataset):
    def __init__(self, base: Dataset, delay_s: float, hold: Optional[str] = None, hold_after: int = 0):
        self.base, self.delay_s, self.hold, self.hold_after, self.loaded = base, delay_s, hold, hold_after, 0
        self.augment = getattr(base, "augment", None)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        if self.delay_s:
            time.sleep(self.delay_s)
        self.loaded += 1
        if self.hold and self.loaded > self.hold_after and os.path.exists(self.hold):
            with open(f"{self.hold}.held", "a") as out:  # a test can wait for this: the job is held still now
                out.write(f"{os.getpid()}\n")
            while os.path.exists(self.hold):
                time.sleep(0.02)
        return self.base[index]


def slow_spiral(seed: int = 0, delay_s: float = 0.001, hold: Optional[str] = None, hold_after: int = 0,
                **kwargs) -> Dataset:
    """The built-in spiral, loading each sample in ``delay_s``: training paced like real data. While a
    file ``hold`` exists, loading waits (after the first ``hold_after`` samples this process loads): a
    harness holds the job still (the same samples, later). Each wait appends the process's pid to
    ``<hold>.held`` as it begins."""
    return _Slow(spiral(seed=seed, **kwargs), delay_s, hold, hold_after)


def slow_diabetes(seed: int = 0, delay_s: float = 0.001, **kwargs) -> Dataset:
    """The built-in diabetes set, paced as ``slow_spiral``."""
    from baton.workers.training.builtins.data import diabetes

    return _Slow(diabetes(seed=seed, **kwargs), delay_s)


class _Served(_Slow):
    """Appends each sample's index, as it is served, to ``served-<pid>`` in ``directory`` (one file per
    process: each rank's own record)."""

    def __init__(self, base: Dataset, delay_s: float, directory: str):
        super().__init__(base, delay_s)
        self.directory = directory

    def __getitem__(self, index: int):
        with open(os.path.join(self.directory, f"served-{os.getpid()}"), "a") as out:
            out.write(f"{index}\n")
        return super().__getitem__(index)


def served_spiral(served_dir: str, seed: int = 0, delay_s: float = 0.001, **kwargs) -> Dataset:
    """slow_spiral that records which samples each process served (``_Served``)."""
    return _Served(spiral(seed=seed, **kwargs), delay_s, served_dir)


def _hang_forever() -> None:
    """User code stuck for good (a dead NFS mount, a deadlocked loader): only the process can end."""
    while True:
        time.sleep(1)


class _HangingMLP(RecordingMLP):
    def __init__(self, hang_after: int, **kwargs):
        super().__init__(**kwargs)
        self.hang_after, self.trained = hang_after, 0

    def forward(self, x):
        if self.training:
            self.trained += 1
            if self.trained > self.hang_after:
                _hang_forever()
        return super().forward(x)


def hanging_mlp(hang_after: int = 5, **kwargs) -> nn.Module:
    """Trains ``hang_after`` micro-batches, then its forward never returns (in every process it runs in)."""
    return _HangingMLP(hang_after, **kwargs)


class _FailingAt(Dataset):
    """Blobs whose sample ``index`` raises, as a corrupt record in real data would."""

    def __init__(self, seed: int, index: int, n: int):
        self.data, self.index = blobs(seed, n), index

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        if i == self.index:
            raise ValueError(f"record {i} is corrupt")
        return self.data[i]


def failing_at(seed: int = 0, index: int = 0, n: int = 300) -> Dataset:
    return _FailingAt(seed, index, n)


def secret_quoting(variable: str = "MY_API_TOKEN", **kwargs) -> nn.Module:
    """User code whose error quotes a secret of its environment, as a failed login often does."""
    import os

    raise RuntimeError(f"login refused for token {os.environ.get(variable)}")


class _HangingInLoader(Dataset):
    """Spiral samples whose loading hangs for good inside a DataLoader worker process (a read from a
    dead mount) after ``hang_after`` samples there. Each loader worker appends its pid to ``pid_file``
    at its first sample, and ``hanging_file`` once it hangs: a test can then look for those processes."""

    def __init__(self, base: Dataset, pid_file: str, hanging_file: str, hang_after: int):
        self.base, self.pid_file, self.hanging_file, self.hang_after = base, pid_file, hanging_file, hang_after
        self.loaded = 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            import os

            if self.loaded == 0:
                with open(self.pid_file, "a") as fh:
                    fh.write(f"{os.getpid()}\n")
            self.loaded += 1
            if self.loaded > self.hang_after:
                with open(self.hanging_file, "a") as fh:
                    fh.write(f"{os.getpid()}\n")
                _hang_forever()
        return self.base[index]


def hanging_in_loader(seed: int = 0, pid_file: str = "", hanging_file: str = "", hang_after: int = 64,
                      **kwargs) -> Dataset:
    return _HangingInLoader(spiral(seed=seed, **kwargs), pid_file, hanging_file, hang_after)


class _FailingOnRank(Dataset):
    """The built-in spiral, whose loading raises on one rank of a data-parallel job only, after
    ``after`` samples there: a record that one rank's share holds and the others' do not."""

    def __init__(self, base: Dataset, rank: int, after: int):
        self.base, self.rank, self.after, self.loaded = base, rank, after, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == self.rank:
            self.loaded += 1
            if self.loaded > self.after:
                raise ValueError(f"sample {index} is unreadable on rank {self.rank}")
        return self.base[index]


def failing_on_rank(seed: int = 0, rank: int = 1, after: int = 0, **kwargs) -> Dataset:
    return _FailingOnRank(spiral(seed=seed, **kwargs), rank, after)
