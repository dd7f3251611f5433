"""Mixed precision and the optimizer step: autocast, GradScaler, unscale, clip, step.

bf16 runs under autocast without a scaler; fp16 needs a GradScaler; fp32 uses neither (the
disabled scaler's calls are no-ops). Gradients are unscaled before they are clipped, so the
clip and the logged norm see true gradients.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import ContextManager, Optional

import torch
from torch import nn

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    name: str  # fp32 | bf16 | fp16
    device: torch.device

    def autocast(self) -> ContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=_DTYPES[self.name])

    def make_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.name == "fp16")


def optimizer_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, max_grad_norm: Optional[float]
) -> float:
    """Unscale, clip, step, update the scale; return the global gradient norm *before* clipping."""
    return float(optimizer_step_norm_tensor(model, optimizer, scaler, max_grad_norm))


def optimizer_step_norm_tensor(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, max_grad_norm: Optional[float]
) -> torch.Tensor:
    """``optimizer_step``, with the pre-clip norm left on the device (reading it is a sync)."""
    scaler.unscale_(optimizer)
    limit = max_grad_norm if max_grad_norm is not None else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
    if hasattr(norm, "full_tensor"):  # sharded gradients (fsdp): the global norm, replicated on every rank
        norm = norm.full_tensor()
    scaler.step(optimizer)
    scaler.update()
    return norm
