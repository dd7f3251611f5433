"""Data-parallel training (``resources.processes: N``) on torch.distributed, one node.

One attempt is the whole group. Rank 0 is the process that runs the attempt (``baton run``, or a
worker's task): it alone holds the lease, fences and commits, through the same checkpointer as a
single-process job. Ranks 1..N-1 are child processes (``launcher``, ``spare_ranks``, ``rank_main`` in
this package) that run the same loop with no checkpointer of their own.

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

import io
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

from baton.schemas.errors import PermanentError

from baton.workers.parallel.rendezvous import prove_membership

COLLECTIVE_TIMEOUT_S = float(os.environ.get("BATON_COLLECTIVE_TIMEOUT_S", "1800"))
"""How long any collective may wait for the other ranks. A rank that dies is noticed at once (its
peers' sockets close); this bounds a rank that hangs alive. It must exceed the longest wait rank 0
can impose on the others: an epoch-end checkpoint waiting for the upload in flight."""

STOP_CODES = {"interrupted": 1, "yielded": 2, "preempted": 3, "cancelled": 4}
"""The stop flag's values; MAX across ranks wins (a cancel outranks a preemption, which outranks the
scheduler's request to yield)."""
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


def share_buffers(module: torch.nn.Module) -> None:
    """Make ``module``'s buffers rank 0's on every rank (a collective on the default group)."""
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)


@dataclass(frozen=True)
class RankSeat:
    """A rank's place: its number among ``world_size``, its device type, and its place on its node
    (``local_rank``: its GPU's index; None where the job has one node: ``rank``)."""

    rank: int
    world_size: int
    device_type: str
    local_rank: Optional[int] = None


@dataclass
class RankGroup:
    """This process's place in the job's process group."""

    rank: int
    world_size: int
    device: torch.device
    seed: int
    control_group: Any = None  # gloo: stop flags and the gathered checkpoint states
    checkpoint_group: Any = None  # fsdp: gloo, used only by the sharded checkpoints' background threads
    closed: bool = field(default=False)

    @classmethod
    def join(cls, store: "dist.Store", seat: "RankSeat", secret: str, *, seed: int, sharded: bool = False,
             timeout_s: float = COLLECTIVE_TIMEOUT_S) -> "RankGroup":
        """Initialise the default process group (gloo on cpu, NCCL on cuda) through ``store`` (the
        attempt's ``rendezvous.SealedStore``), and prove ``secret`` to the other ranks on every group
        this rank joins (RankLost if one does not prove it); a ``sharded`` job's ranks also form the
        group its checkpoints' background threads use."""
        if seat.device_type == "cuda":
            device = torch.device("cuda", seat.rank if seat.local_rank is None else seat.local_rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        rank, world_size = seat.rank, seat.world_size
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        group = cls(rank, world_size, device, seed, dist.group.WORLD)
        try:  # every group is proven as soon as it forms: nothing is exchanged with an unproven peer
            if backend == "nccl":  # stop flags and gathered states travel on gloo
                group.control_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                prove_membership(secret, rank, world_size, group.control_group, "control")
            prove_membership(secret, rank, world_size, dist.group.WORLD, "default", device)
            if sharded:  # DCP's planning unpickles what this group's peers send
                group.checkpoint_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
                prove_membership(secret, rank, world_size, group.checkpoint_group, "checkpoint")
        except BaseException:
            group.close()
            raise
        return group

    # --- collectives ------------------------------------------------------------------------
    def share_buffers(self, module: torch.nn.Module) -> None:
        share_buffers(module)

    def agree_stop(self, local: Optional[str]) -> Optional[str]:
        """Every rank calls this after every optimizer step; all get a reason if any rank has one."""
        flag = torch.tensor([STOP_CODES.get(local, STOP_CODES["preempted"]) if local is not None else 0], dtype=torch.int32)
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


def _to_bytes(state: dict) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> dict:
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=True)


