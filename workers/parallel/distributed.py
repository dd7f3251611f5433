"""Data-parallel training (``resources.processes: N``) on torch.distributed, one node.

One attempt is the whole group. Rank 0 is the process that runs the attempt (``baton run``, or a
worker's task): it alone holds the lease, fences and commits, through the same checkpointer as a
single-process job. Ranks 1..N-1 are child processes (``launcher``, ``rank_main`` in this package)
that run the same loop with no checkpointer of their own.

- **Backends.** gloo on the CPU, NCCL on CUDA (one GPU per rank: rank r uses ``cuda:r`` of the
  devices its worker offers). Flags and the ranks' checkpoint states travel on a gloo group in both
  cases, so the per-step stop flag never waits on a CUDA stream.
- **Membership.** The ranks meet through a store whose values are sealed with the attempt's secret,
  and on every group they form (the default one, gloo's control group beside NCCL, a sharded job's
  checkpoint group) each rank proves the secret to the others (``rendezvous``) before anything else
  is exchanged. What rank 0 receives is tensors, and the ranks' states as
  ``torch.save`` bytes it loads with ``weights_only=True``: torch's ``*_object`` collectives would
  unpickle whatever a peer sent, code of its choosing.
- **Model.** ``DistributedDataParallel`` averages gradients across ranks during backward; it is
  used for the training loss only (``DistributedTask``), so ``parts.model`` stays the plain module
  and a checkpoint's ``model`` is what a single-process job's is. Every rank holds the same
  optimizer state and steps on the same averaged gradients: one rank's copy is the state.
- **Data.** ``data.batch_size`` is per rank; each rank trains on its share of every global batch
  and validates on its shard (``sharding.py``), built before the scheduler so that the schedule
  counts global steps.
- **Randomness.** Every rank builds its components after seeding with the job's seed (identical
  initial weights); ranks r > 0 then reseed from (seed, rank), so their dropout streams differ.
  A checkpoint holds every rank's RNG, loader state and progress (its running loss sums are its
  own) under ``ranks``, gathered to rank 0 at
  each checkpoint, and each rank restores its own.
- **Stop agreement.** After every optimizer step the ranks all-reduce a one-int stop flag (MAX):
  SIGTERM reaching any rank (or rank 0's cancel, lease loss) stops them all at the same step, and
  rank 0 writes the one stop checkpoint.
- **Loss of a rank.** A rank that dies breaks the next collective on the others (gloo and NCCL
  report a closed peer), and a collective that hangs times out after ``BATON_COLLECTIVE_TIMEOUT_S``.
  Rank 0 then raises ``RankLost`` (retried as a worker loss) or ``RankFailed`` (the job's code
  raised on that rank: not retried), and kills the other ranks by PID (``launcher``).
"""
from __future__ import annotations

import dataclasses
import io
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Collection, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from baton.schemas.errors import PermanentError
from baton.storage.checkpointing.checkpointer import AsyncCheckpointer, CheckpointerTotals, CheckpointRequest
from baton.workers.training import rng
from baton.workers.training.components import Components
from baton.workers.training.control import LoopControl, StepReport
from baton.workers.training.data import derive_seed
from baton.workers.training.progress import Progress
from baton.workers.training.task_api import BoundTask

from baton.workers.parallel.rendezvous import prove_membership

COLLECTIVE_TIMEOUT_S = float(os.environ.get("BATON_COLLECTIVE_TIMEOUT_S", "1800"))
"""How long any collective may wait for the other ranks. A rank that dies is noticed at once (its
peers' sockets close); this bounds a rank that hangs alive. It must exceed the longest wait rank 0
can impose on the others: an epoch-end checkpoint waiting for the upload in flight."""

STOP_CODES = {"interrupted": 1, "preempted": 2, "cancelled": 3}
"""The stop flag's values; MAX across ranks wins (a cancel outranks a preemption)."""
_REASONS = {code: reason for reason, code in STOP_CODES.items()}


def written_by(state: dict) -> int:
    """How many ranks wrote a checkpoint (its state, or a sharded one's rank file); 1 before the field."""
    return int(state.get("config", {}).get("processes", 1))


def check_same_processes(state: Optional[dict], processes: int) -> None:
    """A checkpoint resumes only with the rank count that wrote it (each rank's RNG and data share
    belong to it; resharding would change the bits)."""
    if state is None:
        return
    saved = written_by(state)
    if saved != processes:
        raise PermanentError(
            f"resources.processes: this job's checkpoints were written by {saved} process(es) and the spec asks for "
            f"{processes}; a job resumes only with the same count (each rank's RNG and data share are in the "
            f"checkpoint). Set resources.processes: {saved}, or start a new job")


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


def share_buffers(module: torch.nn.Module) -> None:
    """Make ``module``'s buffers rank 0's on every rank (a collective on the default group)."""
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)


@dataclass
class RankGroup:
    """This process's place in the job's process group."""

    rank: int
    world_size: int
    device: torch.device
    seed: int
    control_group: Any = None  # gloo: stop flags and the gathered checkpoint states
    strategy: str = "ddp"  # resources.strategy: ddp | fsdp
    checkpoint_group: Any = None  # fsdp: gloo, used only by the sharded checkpoints' background threads
    precision: str = "fp32"  # loop.precision: fsdp's mixed-precision policy
    closed: bool = field(default=False)

    @classmethod
    def join(cls, store: "dist.Store", rank: int, world_size: int, device_type: str, seed: int, secret: str,
             timeout_s: float = COLLECTIVE_TIMEOUT_S, strategy: str = "ddp", precision: str = "fp32",
             local_rank: Optional[int] = None) -> "RankGroup":
        """Initialise the default process group (gloo on cpu, NCCL on cuda) through ``store`` (the
        attempt's ``rendezvous.SealedStore``), and prove ``secret`` to the other ranks on every group
        this rank joins (RankLost if one does not prove it). ``local_rank``: the
        rank's place on its node (its GPU's index), ``rank`` where the job has one node."""
        if device_type == "cuda":
            device = torch.device("cuda", rank if local_rank is None else local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        group = cls(rank, world_size, device, seed, dist.group.WORLD, strategy, precision=precision)
        try:  # every group is proven as soon as it forms: nothing is exchanged with an unproven peer
            if backend == "nccl":  # stop flags and gathered states travel on gloo
                group.control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                prove_membership(secret, rank, world_size, group.control_group, "control")
            prove_membership(secret, rank, world_size, dist.group.WORLD, "default", device)
            if strategy == "fsdp":  # DCP's planning unpickles what this group's peers send
                group.checkpoint_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                prove_membership(secret, rank, world_size, group.checkpoint_group, "checkpoint")
        except BaseException:
            group.close()
            raise
        return group

    # --- building the rank's pieces ---------------------------------------------------------
    @property
    def sharded(self) -> bool:
        return self.strategy == "fsdp"

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """What ``build_components`` does to the model before the optimizer is built on it: shard it
        over the ranks (fsdp, ``fsdp.shard_model``); ddp wraps it later (``adopt``)."""
        if not self.sharded:
            return model
        from torch.distributed.device_mesh import DeviceMesh

        from baton.workers.parallel.fsdp import shard_model

        # the default group, proven: ``init_device_mesh`` may form a group of its own (a CPU job on a
        # host with CUDA) that nobody proved
        mesh = DeviceMesh.from_group(dist.group.WORLD, self.device.type)
        return shard_model(model, mesh, self.precision)

    def adopt(self, parts: Components) -> Components:
        """Wrap the model in DDP for the training loss (ddp; fsdp: sharded already, with FSDP's
        mixed precision instead of autocast) and give this rank its RNG (the components were built
        for this rank: ``build_components(..., rank, world_size)`` shards the data)."""
        if self.sharded:
            parts.task = DistributedTask(parts.task, None, parts.model)
            parts.precision = dataclasses.replace(parts.precision, name="fp32")  # FSDP's policy casts instead
        else:
            device_ids = [parts.device.index] if parts.device.type == "cuda" else None
            ddp = DistributedDataParallel(parts.model, device_ids=device_ids)
            parts.task = DistributedTask(parts.task, ddp, parts.model)
        if self.rank:
            rng.seed_all(derive_seed(self.seed, "rank", self.rank))
        return parts

    def control(self, inner: LoopControl) -> "GroupControl":
        return GroupControl(inner, self)

    def checkpointer(self, inner: Optional[AsyncCheckpointer], parts: Components, paths,
                     progress_of: Callable[[], Progress]) -> "GroupCheckpointer":
        return GroupCheckpointer(self, inner, parts, paths, progress_of)

    def share_buffers(self, module: torch.nn.Module) -> None:
        share_buffers(module)

    def restore(self, parts: Components, state: dict) -> Progress:
        """Put back this rank's own RNG and loader state (``train_state.restore`` put rank 0's) and
        return its own progress (the position is every rank's; the running loss sums are its own)."""
        mine = state["ranks"][self.rank]
        parts.data.load_state_dict(mine["data"])
        rng.restore(mine["rng"], parts.device)
        return Progress.from_state(mine["progress"])

    # --- collectives ------------------------------------------------------------------------
    def agree_stop(self, local: Optional[str]) -> Optional[str]:
        """Every rank calls this after every optimizer step; all get a reason if any rank has one."""
        flag = torch.tensor([STOP_CODES.get(local, 2) if local is not None else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control_group)
        code = int(flag.item())
        if code == 0:
            return None
        return local if local is not None else _REASONS[code]

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (every rank calls this at the same point)."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.control_group)
        return bool(value.item())

    def max_over_ranks(self, value: int) -> int:
        """The largest of every rank's ``value`` (every rank calls this at the same point)."""
        total = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=self.control_group)
        return int(total.item())

    def sum_over_ranks(self, *values: float) -> list[float]:
        totals = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(totals, group=self.control_group)
        return totals.tolist()

    def gather_to_first(self, state: dict, group: Any = None) -> Optional[list]:
        """Every rank's ``state`` (tensors, numbers, containers: what a checkpoint holds), at rank 0;
        None on the others. It travels as ``torch.save`` bytes in a uint8 tensor and is loaded with
        ``weights_only=True``, so nothing a peer sends can run code at rank 0. Rank 0 keeps its own
        (built afresh for each checkpoint) and sends nothing. ``group``: the control group if None."""
        group = self.control_group if group is None else group
        payload = _to_bytes(state) if self.rank else torch.zeros(0, dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64), group=group)
        longest = max(int(size.item()) for size in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)  # gloo's gather takes equal sizes
        padded[:payload.numel()] = payload
        gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(padded, gathered, dst=0, group=group)
        if gathered is None:
            return None
        return [state, *(_from_bytes(data[:int(size.item())]) for data, size in zip(gathered[1:], sizes[1:]))]

    def close(self) -> None:
        if not self.closed and dist.is_initialized():
            self.closed = True
            dist.destroy_process_group()


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
    """The checkpointer as the loop sees it on every rank. A save is a collective: every rank's RNG
    and loader state is gathered to rank 0 (whether or not rank 0 then skips a periodic one, so the
    ranks never disagree on the collectives), and rank 0's checkpointer takes the snapshot with the
    gathered states under ``ranks``. Other ranks write nothing."""

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
        if self.inner is None:
            return False
        return self.inner.save(lambda: with_ranks(capture(), ranks), request, mandatory, stable)

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


def _to_bytes(state: dict) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> dict:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


def with_ranks(state: dict, ranks: list) -> dict:
    """A group's checkpoint: a single-process one plus every rank's own state and the rank count."""
    return {**state, "ranks": ranks, "config": {**state["config"], "processes": len(ranks)}}
