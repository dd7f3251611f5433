"""A sharded job's training state (``resources.strategy: fsdp``): what each rank writes, and putting it back.

A sharded checkpoint is a torch.distributed.checkpoint (DCP) directory, readable by DCP and the
tools built on it (torchtitan's, ``dcp_to_torch_save``), beside each rank's own state:

- ``.metadata`` and ``__<rank>_0.distcp``: DCP's files for ``{"model": ..., "optimizer": ...}``,
  the state dicts of ``torch.distributed.checkpoint.state_dict.get_state_dict`` (keyed by the
  parameters' names, each tensor the rank's shard of it), which DCP can load on another number of
  ranks;
- ``rank-<r>.pt``: that rank's RNG, loader state and progress, with the state every rank shares
  (scheduler, scaler, best tracker, metrics rows, config): what a single-process checkpoint holds
  besides the model and optimizer (``train_state.capture``), written by ``torch.save`` and loaded
  with ``weights_only=True``.

DCP's ``.metadata`` and the optimizer's non-tensor values (its param groups) are pickles, as DCP
writes them: baton loads a checkpoint only after every file's sha256 matched the digest its fenced
commit recorded (``baton.storage.artifacts.download_checkpoint``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from baton.storage.checkpoint_io import SHARDS_KEY, load_bytes
from baton.workers.training import train_state
from baton.workers.training.components import Components
from baton.workers.training.progress import BestTracker, Progress

from baton.workers.parallel import reshard


SHARDED = ("model", "optimizer")
"""The parts of the state DCP writes; the rest is the rank's own file."""


def rank_file(rank: int) -> str:
    return f"rank-{rank}.pt"


def sharded_parts(parts: Components) -> dict[str, Any]:
    """The model's and the optimizer's state dicts by parameter name, each tensor this rank's shard
    (DTensors: the live tensors, to be snapshot before the loop moves on)."""
    model, optimizer = get_state_dict(parts.model, parts.optimizer)
    return {"model": model, "optimizer": optimizer}


def own_state(state: dict[str, Any]) -> dict[str, Any]:
    """``train_state.capture``'s state less what DCP writes."""
    return {key: value for key, value in state.items() if key not in SHARDED}


def read_own(directory: Path, rank: int) -> dict[str, Any]:
    """A rank's own file of a downloaded (verified) checkpoint."""
    return load_bytes((directory / rank_file(rank)).read_bytes(), where=str(directory / rank_file(rank)))


def restore(parts: Components, directory: Path, rank: int, world_size: int,
            process_group: Any) -> tuple[Progress, BestTracker, list[dict]]:
    """Load this rank's shards (DCP, a collective over ``process_group``) and its own state. A
    checkpoint written by another number of ranks (allowed by ``resources.reshard``, checked before)
    is resharded by DCP, and the ranks' own states are mapped onto this rank (``reshard``)."""
    state = sharded_parts(parts)  # the layout to load into: DCP fills these tensors in place
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(directory)), process_group=process_group)
    set_state_dict(parts.model, parts.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    first = read_own(directory, 0)
    written_by = reshard.written_by(first)
    if written_by == world_size:
        return train_state.restore_loop_state(parts, read_own(directory, rank) if rank else first)
    _, best, rows = train_state.restore_loop_state(parts, first)  # what every rank shares: rank 0's
    owns = [first, *(read_own(directory, old) for old in range(1, written_by))]
    return reshard.restore_resharded(parts, rank, owns), best, rows


def consolidated_model(directory: Path) -> dict[str, torch.Tensor]:
    """The whole model's state dict (every key, full tensors) from a sharded checkpoint's directory, in
    this process, without torch.distributed: what ``model.safetensors`` and ``best.safetensors`` hold.
    It holds the whole model in host memory, once, at the end of the job."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    loaded: dict[str, Any] = {}  # filled from the metadata's layout: full tensors, on the CPU
    _load_state_dict(loaded, storage_reader=dcp.FileSystemReader(str(directory)), no_dist=True,
                     planner=_EmptyStateDictLoadPlanner(keys={"model"}))
    return loaded["model"]
