"""``builtin:stdlib_text``: characters of the Python standard library's own source, as a stream.

What a fresh machine has without a download: the running interpreter's ``Lib`` directory. Files
are read in sorted order (so every machine with the same Python reads the same text), encoded as
bytes (vocabulary 256), and cut into windows of ``block + 1`` tokens. Every ``val_every``-th
window (by position, fixed) is validation and never trains.

The training part is an IterableDataset (``part: train_windows`` gives the same windows as a map-style
data set, for jobs of several ranks): each pass visits its windows in an order drawn from a
generator seeded by (seed, epoch), which is the data set's own state, as is its position, so
``state_dict()`` is all a resume needs (see ``baton.workers.training.streams``). Loader workers take every
``num_workers``-th window of that order.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from baton.schemas.builtins import StdlibTextKwargs

from baton.workers.training.data import derive_seed


def stdlib_bytes(max_bytes: int) -> torch.Tensor:
    """The first ``max_bytes`` bytes of the standard library's .py files, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    text = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class Windows:
    """Positions of the windows of ``block + 1`` tokens, split into training and validation."""

    def __init__(self, tokens: torch.Tensor, block: int, val_every: int):
        self.tokens, self.block = tokens, block
        starts = range(0, len(tokens) - block - 1, block)
        self.val = [s for i, s in enumerate(starts) if i % val_every == 0]
        self.train = [s for i, s in enumerate(starts) if i % val_every != 0]

    def window(self, start: int) -> torch.Tensor:
        return self.tokens[start:start + self.block + 1]


class TextStream(IterableDataset):
    """Training windows in a per-epoch seeded order; position and epoch are its state."""

    def __init__(self, windows: Windows, seed: int):
        self.windows, self.seed = windows, seed
        self.epoch, self.position = 0, 0  # position: windows of this pass already yielded (per worker)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "stdlib-text", self.epoch))
        order = torch.randperm(len(self.windows.train), generator=generator).tolist()[worker::workers]
        while self.position < len(order):
            start = self.windows.train[order[self.position]]
            self.position += 1
            yield self.windows.window(start)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


class TextWindows(Dataset):
    """The validation windows (or the training ones: ``part: train_windows``), in order."""

    def __init__(self, windows: Windows, starts: list[int]):
        self.windows, self.starts = windows, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows.window(self.starts[index])


def stdlib_text(seed: int = 0, **kwargs) -> Dataset:
    k = StdlibTextKwargs.model_validate(kwargs)
    windows = Windows(stdlib_bytes(k.max_bytes), k.block, k.val_every)
    if k.part == "val":
        return TextWindows(windows, windows.val)
    return TextWindows(windows, windows.train) if k.part == "train_windows" else TextStream(windows, seed)
