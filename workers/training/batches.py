"""Batches of any structure: a tensor, a pair, a dict, nested tuples and lists of tensors.

baton moves a batch to the job's device, counts its samples (for per-sample averages and
throughput) and describes its shape in error messages; the task is what reads it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

import torch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor moved to ``device`` (non-blocking); other values as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {k: to_device(v, device) for k, v in batch.items()}
        return moved if type(batch) is dict else type(batch)(moved)  # type: ignore[call-arg]  # a Mapping subclass's own constructor
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``, depth first, in order."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from tensors(value)


def batch_size(batch: Any) -> int:
    """Samples in ``batch``: the leading dimension of its first tensor."""
    for tensor in tensors(batch):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    raise ValueError(f"a batch of {describe(batch)} holds no tensor with a batch dimension")


def describe(batch: Any, depth: int = 0) -> str:
    """A short structural description: ``(Tensor[32, 2] float32, Tensor[32] int64)``."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).removeprefix('torch.')}"
    if depth > 4:
        return "..."
    if isinstance(batch, Mapping):
        return "{" + ", ".join(f"{k!s}: {describe(v, depth + 1)}" for k, v in batch.items()) + "}"
    if isinstance(batch, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in batch)
        return f"[{inner}]" if isinstance(batch, list) else f"({inner})"
    return type(batch).__name__
