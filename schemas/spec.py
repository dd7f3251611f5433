"""The job spec: everything a worker needs to run (and re-run, bit for bit) a training job.

Every model forbids unknown keys, so a misspelled setting is an error rather than a silent default.
Cross-field rules live in ``model_validator``s that report every problem at once.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .builtins import BUILTIN_DATA, BUILTIN_MODELS
from .errors import SpecError
from .problems import Problems, problems_from
from .targets import parse_target

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
METRIC_MODES = {"val_loss": "min", "val_accuracy": "max", "train_loss": "min"}


class _Spec(BaseModel):
    # strict: "0.1" (a string) is not silently taken for a number
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _check_target(problems: Problems, target: str, kwargs: dict, registry: dict) -> None:
    try:
        parsed = parse_target(target)
    except ValueError as exc:
        problems.add("target", str(exc))
        return
    if not parsed.is_builtin:
        return
    if parsed.attr not in registry:
        problems.add("target", f"unknown built-in {parsed.attr!r}; choose one of {sorted(registry)}")
        return
    try:
        registry[parsed.attr].model_validate(kwargs)
    except ValidationError as exc:
        problems.lines.extend(problems_from(exc, prefix="kwargs"))


class ModelSpec(_Spec):
    target: str = Field(description="'builtin:mlp', 'builtin:cnn' or 'package.module:callable' returning an nn.Module.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the target.")

    @model_validator(mode="after")
    def _target(self) -> "ModelSpec":
        problems = Problems()
        _check_target(problems, self.target, self.kwargs, BUILTIN_MODELS)
        problems.raise_if_any()
        return self


class DataSpec(_Spec):
    target: str = Field(
        description="'builtin:spiral', 'builtin:digits' or 'package.module:callable' returning a map-style "
        "Dataset of (input, label) pairs; it receives the job's seed as `seed` if it accepts one."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the target.")
    batch_size: int = Field(64, gt=0, le=1_000_000, description="Samples per micro-batch.")
    val_batch_size: Optional[int] = Field(None, gt=0, description="Validation batch size; defaults to batch_size.")
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes (part of the reproducible configuration).")
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of the data held out for validation (split by seed).")

    @model_validator(mode="after")
    def _target(self) -> "DataSpec":
        problems = Problems()
        _check_target(problems, self.target, self.kwargs, BUILTIN_DATA)
        problems.raise_if_any()
        return self


class OptimizerSpec(_Spec):
    name: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(gt=0.0, le=10.0, description="Learning rate (OneCycle's peak).")
    weight_decay: float = Field(0.0, ge=0.0, lt=1.0, description="Weight decay (decoupled for adamw).")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="Momentum; sgd only.")
    # strict=False: JSON and YAML carry a pair as a list
    betas: tuple[float, float] = Field((0.9, 0.999), strict=False, description="Adam betas; adam/adamw only.")

    @model_validator(mode="after")
    def _fits_optimizer(self) -> "OptimizerSpec":
        problems = Problems()
        if self.momentum and self.name != "sgd":
            problems.add("momentum", f"only sgd uses momentum (name is {self.name!r}); for adam use betas")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            problems.add("betas", f"each must be in [0, 1) (got {list(self.betas)})")
        problems.raise_if_any()
        return self


class SchedulerSpec(_Spec):
    name: Literal["onecycle", "cosine", "step", "none"] = Field(
        "none", description="onecycle steps every optimizer step; cosine and step every epoch."
    )
    warmup_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="onecycle: share of steps spent warming up.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine: final lr as a fraction of optimizer.lr.")
    step_epochs: int = Field(10, gt=0, description="step: epochs between decays.")
    gamma: float = Field(0.1, gt=0.0, le=1.0, description="step: decay factor.")

    @property
    def per_step(self) -> bool:
        """Whether the scheduler steps after every optimizer step (else once per epoch)."""
        return self.name == "onecycle"


class LoopSpec(_Spec):
    epochs: int = Field(gt=0, le=100_000, description="Passes over the training split.")
    grad_accum_steps: int = Field(1, gt=0, le=1024, description="Micro-batches per optimizer step.")
    max_grad_norm: Optional[float] = Field(1.0, gt=0.0, description="Clip the global gradient norm to this; null disables clipping.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="bf16/fp16 run under autocast; fp16 adds a GradScaler (CUDA only).")
    deterministic: bool = Field(True, description="Deterministic algorithms and pinned threads: the condition for bit-exact resume.")
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="On a NaN/inf loss: fail the job, or skip that optimizer step and count it."
    )


class CheckpointSpec(_Spec):
    every_steps: Optional[int] = Field(100, gt=0, description="Mid-epoch checkpoint every N optimizer steps; null: epoch ends only.")
    keep_last: int = Field(3, description="Step checkpoints kept (the best one is kept apart).")
    monitor: Literal["val_loss", "val_accuracy", "train_loss"] = Field("val_loss", description="Metric that picks the best checkpoint.")
    mode: Literal["min", "max"] = Field("min", description="Whether a lower or a higher monitored value is better.")

    @model_validator(mode="after")
    def _sane(self) -> "CheckpointSpec":
        problems = Problems()
        if self.keep_last < 2:
            problems.add("keep_last", "must be >= 2 (the newest checkpoint may still be uploading when an older one is needed)")
        if self.mode != METRIC_MODES[self.monitor]:
            problems.add("mode", f"{self.monitor} improves when it goes {'down' if METRIC_MODES[self.monitor] == 'min' else 'up'}; "
                                 f"use mode: {METRIC_MODES[self.monitor]}")
        problems.raise_if_any()
        return self


class ResourcesSpec(_Spec):
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when the worker has one, else cpu.")
    queue: str = Field("default", pattern=NAME_PATTERN, description="Celery queue the job is routed to.")
    cpu_threads: Optional[int] = Field(
        None, gt=0, le=1024,
        description="torch intra-op threads; null: the first attempt's count, re-applied on every resume.",
    )


class RetrySpec(_Spec):
    max_attempts: int = Field(3, gt=0, le=100, description="Attempts in all, counting the first; only infrastructure loss is retried.")


class JobSpec(_Spec):
    name: str = Field(pattern=NAME_PATTERN, description="Human-readable job name.")
    seed: int = Field(0, ge=0, lt=2**63, description="Seeds weights, the split, shuffling, dropout and augmentation.")
    model: ModelSpec = Field(description="What to train.")
    data: DataSpec = Field(description="What to train on.")
    optimizer: OptimizerSpec = Field(description="How to update the weights.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="Learning-rate schedule.")
    loop: LoopSpec = Field(description="The training loop.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="When to checkpoint, what to keep.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Where the job runs.")
    retry: RetrySpec = Field(default_factory=RetrySpec, description="How often infrastructure loss is retried.")

    @model_validator(mode="after")
    def _cross_field(self) -> "JobSpec":
        problems = Problems()
        if self.loop.precision == "fp16" and self.resources.device != "cuda":
            problems.add("loop.precision", "fp16 needs resources.device: cuda (use bf16 on the CPU)")
        if self.scheduler.name == "onecycle" and self.scheduler.warmup_fraction == 0.0:
            problems.add("scheduler.warmup_fraction", "onecycle needs a warmup > 0")
        problems.raise_if_any()
        return self

    @classmethod
    def parse(cls, data: Any) -> "JobSpec":
        """Validates a mapping; raises SpecError with one line per wrong field."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise SpecError([f"spec: must be a mapping (got {type(data).__name__})"])
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(problems_from(exc)) from None
