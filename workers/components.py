"""Building the trainable pieces from a spec, in the order that keeps them consistent.

The model is moved to its device *before* the optimizer is built: moving it afterwards can
replace parameter objects, leaving the optimizer updating tensors the model no longer uses.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, OneCycleLR, StepLR

from schemas.errors import PermanentError
from schemas.spec import JobSpec, OptimizerSpec, SchedulerSpec

from .amp import Precision
from .data import DataPlan
from .targets import build_dataset, build_model


def build_optimizer(model: nn.Module, spec: OptimizerSpec) -> torch.optim.Optimizer:
    params = model.parameters()
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    return cls(params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)


def build_scheduler(
    optimizer: torch.optim.Optimizer, spec: SchedulerSpec, lr: float, epochs: int, steps_per_epoch: int
) -> Optional[LRScheduler]:
    if spec.name == "onecycle":
        total = epochs * steps_per_epoch
        if spec.warmup_fraction * total < 2 or (1 - spec.warmup_fraction) * total < 2:
            raise PermanentError(
                f"scheduler.warmup_fraction: {spec.warmup_fraction} of this job's {total} optimizer steps leaves "
                "fewer than 2 steps for warmup or for annealing; change it, or train longer"
            )
        return OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=spec.warmup_fraction)
    if spec.name == "cosine":
        return CosineAnnealingLR(optimizer, T_max=epochs, eta_min=lr * spec.min_lr_ratio)
    if spec.name == "step":
        return StepLR(optimizer, step_size=spec.step_epochs, gamma=spec.gamma)
    return None


@dataclass
class Components:
    spec: JobSpec
    device: torch.device
    data: DataPlan
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Optional[LRScheduler]
    scaler: torch.amp.GradScaler
    precision: Precision

    @property
    def steps_per_epoch(self) -> int:
        accum = self.spec.loop.grad_accum_steps
        return -(-self.data.batches_per_epoch // accum)

    @property
    def total_steps(self) -> int:
        return self.spec.loop.epochs * self.steps_per_epoch


def build_components(spec: JobSpec, device: torch.device, allowed_prefixes: tuple[str, ...]) -> Components:
    """Data, model (on its device), then optimizer, scheduler and scaler. Seed the RNGs first."""
    dataset = build_dataset(spec.data, spec.seed, allowed_prefixes)
    data = DataPlan.build(dataset, spec.data, spec.seed, pin_memory=device.type == "cuda")
    model = build_model(spec.model, allowed_prefixes).to(device)
    optimizer = build_optimizer(model, spec.optimizer)
    steps_per_epoch = -(-data.batches_per_epoch // spec.loop.grad_accum_steps)
    scheduler = build_scheduler(optimizer, spec.scheduler, spec.optimizer.lr, spec.loop.epochs, steps_per_epoch)
    precision = Precision(spec.loop.precision, device)
    return Components(spec, device, data, model, optimizer, scheduler, precision.make_scaler(), precision)
