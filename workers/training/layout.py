"""How a job's processes share its work: the seam between one process (``OneProcess``, here), a
data-parallel group and a sharded group (``baton.workers.parallel.layouts``). What differs between
them is asked of the layout, never tested for: how the model is prepared and wrapped, how the loop's
stop is agreed, which checkpointer each rank has, how a rank restores its state, and what the ranks
sum or compare. ``assembly.py`` builds a rank's loop from it, the same way on every rank."""
from __future__ import annotations

from typing import Callable, Optional, Protocol, Sized

import torch
from torch import nn

from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.checkpointing.contract import Checkpointer, CheckpointTarget
from baton.workers.training import train_state
from baton.workers.training.components import Components
from baton.workers.training.control import LoopControl
from baton.workers.training.progress import BestTracker, Progress

Restored = tuple[Progress, BestTracker, list[dict]]


class Layout(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """What happens to the model before its optimizer is built on it."""

    def adopt(self, parts: Components) -> Components:
        """The components this rank trains with (the model wrapped, its own RNG)."""

    def control(self, inner: LoopControl) -> LoopControl:
        """The loop's control on this rank (a stop agreed by every rank)."""

    def checkpointer(self, parts: Components, target: CheckpointTarget,
                     progress_of: Callable[[], Progress]) -> Checkpointer:
        """This rank's checkpointer, writing to ``target``."""

    def restore(self, parts: Components, state: dict) -> Restored:
        """Put this rank's share of a checkpoint back; its progress, best tracker and metrics rows."""

    def validation_forwards(self, loader: Sized) -> Optional[int]:
        """How many validation forwards every rank makes (None: as many as ``loader`` has batches; a
        stream's loader may have no length)."""

    def sum_over_ranks(self, *values: float) -> list[float]:
        """Every rank's ``values`` summed (every rank calls this at the same point)."""

    def close(self) -> None:
        """Leave the group, if any."""


class OneProcess:
    """A job in one process: it holds the whole state and writes its own checkpoints."""

    rank = 0
    world_size = 1

    def __init__(self, device: torch.device):
        self.device = device

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    def adopt(self, parts: Components) -> Components:
        return parts

    def control(self, inner: LoopControl) -> LoopControl:
        return inner

    def checkpointer(self, parts: Components, target: CheckpointTarget,
                     progress_of: Callable[[], Progress]) -> Checkpointer:
        return AsyncCheckpointer(target, pin_memory=self.device.type == "cuda")

    def restore(self, parts: Components, state: dict) -> Restored:
        return train_state.restore(parts, state)

    def validation_forwards(self, loader: Sized) -> Optional[int]:
        return None

    def sum_over_ranks(self, *values: float) -> list[float]:
        return list(values)

    def close(self) -> None:
        pass
