"""Building the trainable pieces from a spec, in the order that keeps them consistent.

The model is moved to its device *before* the optimizer is built: moving it afterwards can
replace parameter objects, leaving the optimizer updating tensors the model no longer uses.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler, OneCycleLR, StepLR
from torch.utils.data import IterableDataset

from baton.schemas.errors import PermanentError
from baton.schemas.spec import JobSpec, OptimizerSpec, SchedulerSpec

from baton.workers.training.amp import Precision
from baton.workers.training.data import DataPlan, Loading
from baton.workers.training.sharding import ShardedPlan
from baton.workers.training.streams import StreamPlan
from baton.workers.training.targets import build_collate, build_dataset, build_model, build_task
from baton.workers.training.task_api import BoundTask


def parameter_groups(model: nn.Module, spec: OptimizerSpec):
    """All parameters in one group, or (with no_decay_bias_and_norm) those of fewer than 2
    dimensions (biases, norm weights) in a second group without weight decay."""
    if not spec.no_decay_bias_and_norm:
        return model.parameters()
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in trainable if p.dim() >= 2], "weight_decay": spec.weight_decay},
            {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, spec: OptimizerSpec) -> torch.optim.Optimizer:
    params = parameter_groups(model, spec)
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    return cls(params, lr=spec.lr, betas=spec.betas, weight_decay=spec.weight_decay)


def warmup_factor(spec: SchedulerSpec, total: int):
    """The lr multiplier per optimizer step of warmup_cosine / constant_warmup: linear warmup from
    1/(W+1) to 1 over W steps, then constant or a half cosine down to min_lr_ratio at ``total``."""
    warmup = spec.warmup_steps if spec.warmup_steps is not None else int(spec.warmup_fraction * total)
    if warmup >= total:
        raise PermanentError(f"scheduler: warmup of {warmup} steps leaves none of this job's {total} optimizer steps "
                             "for the schedule; shorten the warmup or train longer")
    floor, cosine = spec.min_lr_ratio, spec.name == "warmup_cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if not cosine:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, spec: SchedulerSpec, lr: float, epochs: Optional[int], total: Optional[int]
) -> Optional[LRScheduler]:
    """``total`` is the run's optimizer steps (None when unknown: a stream without max_steps)."""
    if spec.per_step and total is None:
        raise PermanentError(f"scheduler.name: {spec.name} needs the run's length in steps; set loop.max_steps")
    if spec.per_step:
        assert total is not None
        return _per_step_scheduler(optimizer, spec, lr, total)
    if spec.name == "cosine":
        return CosineAnnealingLR(optimizer, T_max=epochs or 1, eta_min=lr * spec.min_lr_ratio)
    if spec.name == "step":
        return StepLR(optimizer, step_size=spec.step_epochs, gamma=spec.gamma)
    return None


def _per_step_scheduler(optimizer: torch.optim.Optimizer, spec: SchedulerSpec, lr: float, total: int) -> Optional[LRScheduler]:
    if spec.name == "onecycle":
        if spec.warmup_fraction * total < 2 or (1 - spec.warmup_fraction) * total < 2:
            raise PermanentError(
                f"scheduler.warmup_fraction: {spec.warmup_fraction} of this job's {total} optimizer steps leaves "
                "fewer than 2 steps for warmup or for annealing; change it, or train longer"
            )
        return OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=spec.warmup_fraction,
                          cycle_momentum=spec.cycle_momentum)
    if spec.name in ("warmup_cosine", "constant_warmup"):
        return LambdaLR(optimizer, warmup_factor(spec, total))
    return None


@dataclass
class Components:
    spec: JobSpec
    device: torch.device
    data: Union[DataPlan, StreamPlan, ShardedPlan]
    model: nn.Module
    task: BoundTask
    optimizer: torch.optim.Optimizer
    scheduler: Optional[LRScheduler]
    scaler: torch.amp.GradScaler
    precision: Precision
    run_steps: Optional[int] = None  # the run's optimizer steps where not the spec's (a resharded resume's)
    schedule_steps: Optional[int] = None  # a per-step schedule's length where not the run's (the same)

    @property
    def total_steps(self) -> Optional[int]:
        return self.run_steps if self.run_steps is not None else run_length(self.spec, self.data)

    @property
    def schedule_total(self) -> Optional[int]:
        """The length the per-step schedule was built for."""
        return self.schedule_steps if self.schedule_steps is not None else run_length(self.spec, self.data)

    def rebuild_schedule(self, total: int) -> None:
        """Build the schedule again for ``total`` steps, the optimizer's param groups (the learning rate,
        and momentum where the schedule cycles it) left as they were: a schedule's constructor sets them."""
        groups = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": building, not stepping
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler = build_scheduler(self.optimizer, self.spec.scheduler, self.spec.optimizer.lr,
                                             self.spec.loop.epochs, total)
        for group, saved in zip(self.optimizer.param_groups, groups):
            group.update(saved)
        self.schedule_steps = total


def run_length(spec: JobSpec, data: Union[DataPlan, StreamPlan, ShardedPlan]) -> Optional[int]:
    """The run's optimizer steps: max_steps, or epochs x steps per pass (None for a stream by epochs)."""
    if spec.loop.max_steps is not None:
        return spec.loop.max_steps
    if data.batches_per_pass is None or spec.loop.epochs is None:
        return None
    return spec.loop.epochs * -(-data.batches_per_pass // spec.loop.grad_accum_steps)


def build_data(spec: JobSpec, device: torch.device, allowed_prefixes: tuple[str, ...], rank: int = 0,
               world_size: int = 1) -> Union[DataPlan, StreamPlan, ShardedPlan]:
    """The data plan; with ``world_size`` > 1, rank ``rank``'s share of it (``sharding.py``)."""
    dataset = build_dataset(spec.data, spec.seed, allowed_prefixes)
    val = build_dataset(spec.data.val, spec.seed, allowed_prefixes) if spec.data.val is not None else None
    loading = Loading(spec.data, spec.seed, build_collate(spec.data.collate, allowed_prefixes), device.type == "cuda")
    if isinstance(dataset, IterableDataset):
        if world_size > 1:
            raise PermanentError(f"data target {spec.data.target} is an IterableDataset: resources.processes > 1 needs "
                                 "a map-style data set (a stream cannot yet be sharded across ranks exactly)")
        return StreamPlan.build(dataset, loading, val, spec.loop.max_steps)
    plan = DataPlan.build(dataset, loading, val)
    return plan if world_size == 1 else ShardedPlan(plan, rank, world_size)


def check_monitor(spec: JobSpec, task: BoundTask) -> None:
    """A monitor the task does not report is refused before any training, naming what exists."""
    reported = {"train_loss", *task.reported}
    if spec.checkpoint.monitor not in reported:
        raise PermanentError(f"checkpoint.monitor: {spec.checkpoint.monitor!r} is not reported by task {task.target}; "
                             f"it reports {sorted(reported)}")


def build_components(spec: JobSpec, device: torch.device, allowed_prefixes: tuple[str, ...], rank: int = 0,
                     world_size: int = 1, prepare_model: Optional[Callable[[nn.Module], nn.Module]] = None) -> Components:
    """Task, data, model (on its device), then optimizer, scheduler and scaler. Seed the RNGs first.
    A data-parallel rank gets its share of the data, so the schedule counts global steps;
    ``prepare_model`` (a sharded job's: shard it) runs before the optimizer is built on the model."""
    task = build_task(spec.task, allowed_prefixes)
    check_monitor(spec, task)
    data = build_data(spec, device, allowed_prefixes, rank, world_size)
    model = build_model(spec.model, allowed_prefixes).to(device)
    if prepare_model is not None:
        model = prepare_model(model)
    optimizer = build_optimizer(model, spec.optimizer)
    scheduler = build_scheduler(optimizer, spec.scheduler, spec.optimizer.lr, spec.loop.epochs, run_length(spec, data))
    precision = Precision(spec.loop.precision, device)
    return Components(spec, device, data, model, task, optimizer, scheduler, precision.make_scaler(), precision)
