"""Per-step readings kept on the device and read back in one transfer per optimizer step.

``loss.item()`` on every micro-batch and ``float(grad_norm)`` after every clip are each a device
synchronisation: on CUDA the host waits for the queue to drain, twice per step. Here the loop
hands over the loss (and the sample count) of each micro-batch and the pre-clip norm of each
step as tensors, and reads them all back in one transfer when it must know them: before the
optimizer step (the non-finite policy decides whether to step), and before a validation or a
checkpoint reads the running sums. On the CPU, where reading is no synchronisation, each is
read with ``.item()`` at that moment instead (cheaper than stacking them).

The values read are the same float32 numbers ``.item()`` gave, converted to Python floats in the
same order, so every sum built from them is bit for bit the one the per-micro-batch reads built.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass(frozen=True)
class LossReading:
    value: float  # the micro-batch's loss, as .item() gives it
    samples: int
    epoch: int  # where it was taken, for the non-finite error message
    batch_in_epoch: int
    step: int
    lr: Optional[float] = None  # the learning rate its optimizer step uses (None: not read without a sync)


@dataclass
class PendingReadings:
    """Losses of the current accumulation group and norms of past steps, not yet read."""

    _losses: list[torch.Tensor] = field(default_factory=list)
    _where: list[tuple[int, int, int, int, Optional[float]]] = field(default_factory=list)  # samples, epoch, batch, step, lr
    _norms: list[torch.Tensor] = field(default_factory=list)

    def add_loss(self, loss: torch.Tensor, samples: int, epoch: int, batch_in_epoch: int, step: int,
                 lr: Optional[float] = None) -> None:
        self._losses.append(_scalar(loss.detach()))
        self._where.append((samples, epoch, batch_in_epoch, step, lr))

    def add_norm(self, norm: torch.Tensor) -> None:
        self._norms.append(_scalar(norm.detach()))

    def read(self) -> tuple[list[LossReading], list[float]]:
        """Everything pending, as Python floats, in the order it was added; then empty."""
        tensors = self._losses + self._norms
        if not tensors:
            return [], []
        values = _to_floats(tensors)
        n = len(self._losses)
        losses = [LossReading(v, *where) for v, where in zip(values[:n], self._where)]
        norms = values[n:]
        self._losses, self._where, self._norms = [], [], []
        return losses, norms


def _scalar(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dim() == 0 else tensor.reshape(())  # the task's loss is 0-d already


def _to_floats(tensors: list[torch.Tensor]) -> list[float]:
    """The values as the same Python floats ``.item()`` gives (a float32 widened to a double, other
    dtypes widened the same way). On the CPU a read synchronises nothing, and ``.item()`` on each
    costs less than the stack a single transfer needs (~10 us a step); on an accelerator the
    values travel in one transfer (``_stacked_floats``)."""
    first = tensors[0]
    one_by_one = (first.device.type == "cpu" or len(tensors) == 1
                  or any(t.dtype != first.dtype or t.device != first.device for t in tensors))  # mixed: rare
    return [t.item() for t in tensors] if one_by_one else _stacked_floats(tensors)


def _stacked_floats(tensors: list[torch.Tensor]) -> list[float]:
    """Tensors of one dtype and device read back in one transfer."""
    return torch.stack(tensors).tolist()


def step_lr(optimizer: torch.optim.Optimizer) -> Optional[float]:
    """The learning rate the coming optimizer step uses, where reading it costs no device synchronisation (a
    tensor rate on an accelerator is left unread: the run's rate curve then has validation points only)."""
    lr = optimizer.param_groups[0]["lr"]
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" else None
    return float(lr)
