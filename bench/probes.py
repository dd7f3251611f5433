"""A model for the benchmarks that counts, itself, the steps it trains (``counting_mlp``): each
training forward appends the time to ``forwards-<pid>`` in a directory, so a benchmark sees when a
process trained its first step and how many steps each process trained, without asking baton."""
from __future__ import annotations

import os
import time
from pathlib import Path

from torch import nn

from baton.workers.training.builtins.models import mlp


class _Counting(nn.Module):
    def __init__(self, directory: str, **kwargs):
        super().__init__()
        self.inner, self.directory = mlp(**kwargs), directory

    def forward(self, x):
        if self.training:
            with open(os.path.join(self.directory, f"forwards-{os.getpid()}"), "a") as out:
                out.write(f"{time.time()}\n")
        return self.inner(x)


def counting_mlp(directory: str, **kwargs) -> nn.Module:
    return _Counting(directory, **kwargs)


def counted_in(directory: Path) -> Path:
    """``directory`` (in a benchmark's own directory, which it lets others pass) made for ``counting_mlp`` to
    write in: the model runs as the job's user, a user of its own where the worker is root (``BATON_JOB_USER``)."""
    directory.mkdir()
    directory.chmod(0o1777)
    directory.parent.chmod(directory.parent.stat().st_mode | 0o011)
    return directory


def forwards(directory: Path) -> dict[int, list[float]]:
    """Each process's training forwards, as wall-clock times."""
    found = {}
    for path in Path(directory).glob("forwards-*"):
        found[int(path.name.split("-", 1)[1])] = [float(line) for line in path.read_text().split()]
    return found
