"""The layouts of a job on several ranks (``training.layout``'s seam): ``DataParallel`` (every rank
holds the whole model, DDP averages the gradients, rank 0 checkpoints every rank's state) and
``Sharded`` (FSDP2: each rank holds and checkpoints its shard; rank 0 commits). ``layout_for`` picks
one for a joined group (``distributed.RankGroup``)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Collection, Optional, Sized

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from baton.storage.checkpointing.checkpointer import AsyncCheckpointer
from baton.storage.checkpointing.contract import (Checkpointer, CheckpointerTotals, CheckpointRequest,
                                                  CheckpointTarget)
from baton.workers.parallel.distributed import RankGroup, share_buffers
from baton.workers.training import rng, train_state
from baton.workers.training.components import Components
from baton.workers.training.control import LoopControl, StepReport
from baton.workers.training.data import derive_seed
from baton.workers.training.layout import Layout, Restored
from baton.workers.training.progress import Progress
from baton.workers.training.task_api import BoundTask

class DistributedTask(BoundTask):
    """The job's task, with the training loss computed through DDP (which averages the gradients
    across ranks in backward), or, sharded (``ddp`` None), through the FSDP module itself.
    Validation scores the module after its buffers (BatchNorm's running statistics) are made
    rank 0's on every rank, as DDP does before each training forward."""

    def __init__(self, bound: BoundTask, ddp: Optional[DistributedDataParallel], module: torch.nn.Module):
        self.__dict__.update(bound.__dict__)
        self.ddp, self.module = ddp, module

    def loss(self, model, batch):
        return super().loss(self.ddp if self.ddp is not None else model, batch)

    def new_metrics(self, device: torch.device):
        share_buffers(self.module)  # every rank calls this once per validation
        return super().new_metrics(device)


class _OnRanks:
    """What every layout on a group shares: the group's rank, size, device, agreed stop and sums."""

    def __init__(self, group: RankGroup):
        self.group = group
        self.rank, self.world_size, self.device = group.rank, group.world_size, group.device

    def control(self, inner: LoopControl) -> LoopControl:
        return GroupControl(inner, self.group)

    def sum_over_ranks(self, *values: float) -> list[float]:
        return self.group.sum_over_ranks(*values)

    def close(self) -> None:
        self.group.close()

    def _own_rng(self) -> None:
        """Ranks r > 0 reseed from (seed, rank) once their components are built: their dropout streams differ."""
        if self.rank:
            rng.seed_all(derive_seed(self.group.seed, "rank", self.rank))


class DataParallel(_OnRanks):
    """Every rank holds the whole model and optimizer state; DDP averages the gradients in backward.
    Rank 0's checkpoint holds every rank's RNG, loader state and progress (gathered at each save)."""

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # wrapped in DDP once the components are built (``adopt``)

    def adopt(self, parts: Components) -> Components:
        device_ids = [parts.device.index] if parts.device.type == "cuda" else None
        parts.task = DistributedTask(parts.task, DistributedDataParallel(parts.model, device_ids=device_ids), parts.model)
        self._own_rng()
        return parts

    def checkpointer(self, parts: Components, target: CheckpointTarget,
                     progress_of: Callable[[], Progress]) -> Checkpointer:
        inner = AsyncCheckpointer(target, pin_memory=self.device.type == "cuda") if self.rank == 0 else None
        return GroupCheckpointer(self.group, inner, parts, target.attempt_paths, progress_of)

    def restore(self, parts: Components, state: dict) -> Restored:
        """Rank 0's state, then this rank's own RNG and loader state, and its own progress (the
        position is every rank's; the running loss sums are its own)."""
        _, best, metrics = train_state.restore(parts, state)
        mine = state["ranks"][self.rank]
        parts.data.load_state_dict(mine["data"])
        rng.restore(mine["rng"], parts.device)
        return Progress.from_state(mine["progress"]), best, metrics

    def validation_forwards(self, loader: Sized) -> Optional[int]:
        return None


class Sharded(_OnRanks):
    """FSDP2: each rank holds its shard of the model and optimizer state and writes it; rank 0
    commits. FSDP's mixed-precision policy casts, so autocast is off."""

    def __init__(self, group: RankGroup, precision: str):
        super().__init__(group)
        self.precision = precision

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import DeviceMesh

        from baton.workers.parallel.fsdp import shard_model

        # the default group, proven: ``init_device_mesh`` may form a group of its own (a CPU job on a
        # host with CUDA) that nobody proved
        mesh = DeviceMesh.from_group(dist.group.WORLD, self.device.type)
        return shard_model(model, mesh, self.precision)

    def adopt(self, parts: Components) -> Components:
        parts.task = DistributedTask(parts.task, None, parts.model)
        parts.precision = dataclasses.replace(parts.precision, name="fp32")  # FSDP's policy casts instead
        self._own_rng()
        return parts

    def checkpointer(self, parts: Components, target: CheckpointTarget,
                     progress_of: Callable[[], Progress]) -> Checkpointer:
        from baton.workers.parallel.sharded_checkpoint import ShardedCheckpointer

        return ShardedCheckpointer(self.group, parts, target)

    def restore(self, parts: Components, state: dict) -> Restored:
        from baton.workers.parallel import sharded_state

        return sharded_state.restore(parts, Path(state[sharded_state.SHARDS_KEY]), self.rank, self.world_size,
                                     self.group.checkpoint_group)

    def validation_forwards(self, loader: Sized) -> Optional[int]:
        """Every rank makes as many forwards as the rank with the most batches (a sharded forward is a collective)."""
        return self.group.max_over_ranks(len(loader))


def layout_for(group: RankGroup, strategy: str, precision: str) -> Layout:
    """The layout of ``resources.strategy`` on a joined group."""
    return Sharded(group, precision) if strategy == "fsdp" else DataParallel(group)


class GroupControl(LoopControl):
    """The loop's control for one rank: stop reasons agreed across the group, the rest passed on."""

    def __init__(self, inner: LoopControl, group: RankGroup):
        self.inner, self.group = inner, group

    def stop_reason(self) -> Optional[str]:
        return self.group.agree_stop(self.inner.stop_reason())

    def on_step(self, report: StepReport) -> None:
        self.inner.on_step(report)

    def on_epoch(self, row: dict) -> None:
        self.inner.on_epoch(row)

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        self.inner.on_resume(step, epoch, batch_in_epoch, attempt, source)

    def log(self, message: str) -> None:
        self.inner.log(message)


class GroupCheckpointer:
    """A data-parallel job's checkpointer as the loop sees it on every rank. A save is a collective: every rank's RNG
    and loader state is gathered to rank 0 (whether or not rank 0 then skips a periodic one, so the
    ranks never disagree on the collectives), and rank 0's checkpointer takes the snapshot with the
    gathered states under ``ranks``. Other ranks write nothing."""

    captures_weights = True

    def __init__(self, group: RankGroup, inner: Optional[AsyncCheckpointer], parts: Components, paths,
                 progress_of: Callable[[], Progress]):
        self.group, self.inner, self.parts, self.progress_of = group, inner, parts, progress_of
        self.paths = inner.paths if inner is not None else paths
        self.totals = inner.totals if inner is not None else CheckpointerTotals()
        self.gather_s: list[float] = []  # per save: capturing and gathering the ranks' states

    def save(self, capture: Callable[[], dict], request: CheckpointRequest, mandatory: bool,
             stable: Optional[Collection[int]] = None) -> bool:
        started = time.perf_counter()
        mine = {"rng": rng.capture(self.parts.device), "data": self.parts.data.state_dict(),
                "progress": self.progress_of().state_dict()}
        ranks = self.group.gather_to_first(mine)
        self.gather_s.append(time.perf_counter() - started)
        if self.inner is None or ranks is None:  # (rank 0, and only rank 0, has both)
            return False
        gathered = ranks
        return self.inner.save(lambda: with_ranks(capture(), gathered), request, mandatory, stable)

    def checkpoint_key(self, step: int) -> str:
        return self.paths.checkpoint(step)

    def describe(self) -> str:
        """This rank's share of the checkpoint stall (for logs and bench/ddp.py)."""
        mean_ms = 1000 * sum(self.gather_s) / len(self.gather_s) if self.gather_s else 0.0
        return f"{len(self.gather_s)} checkpoint gathers, mean {mean_ms:.2f} ms"

    def before_optimizer_step(self) -> None:
        if self.inner is not None:
            self.inner.before_optimizer_step()

    def poll(self) -> None:
        if self.inner is not None:
            self.inner.poll()

    def wait(self) -> None:
        if self.inner is not None:
            self.inner.wait()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    def abandon(self) -> None:
        if self.inner is not None:
            self.inner.abandon()


def with_ranks(state: dict, ranks: list) -> dict:
    """A group's checkpoint: a single-process one plus every rank's own state and the rank count."""
    return {**state, "ranks": ranks, "config": {**state["config"], "processes": len(ranks)}}
