"""The job spec: everything a worker needs to run (and re-run, bit for bit) a training job.

Every model forbids unknown keys, so a misspelled setting is an error rather than a silent default.
Cross-field rules live in ``model_validator``s that report every problem at once.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from baton.schemas.code import CodeSpec
from baton.schemas.builtins import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_TASKS, builtin_task_metrics
from baton.schemas.errors import SpecError
from baton.schemas.problems import Problems, problems_from
from baton.schemas.resources import PRIORITY_LIMIT, ResourcesSpec, RetrySpec
from baton.schemas.section import NAME_PATTERN, Section as _Spec
from baton.schemas.targets import parse_target

__all__ = ["JobSpec", "NAME_PATTERN", "PRIORITY_LIMIT", "ResourcesSpec", "RetrySpec"]

MONITOR_PATTERN = r"^(train_loss|val_[a-z][a-z0-9_]{0,47})$"
DEFAULT_VAL_FRACTION = 0.2


def check_target(problems: Problems, target: str, kwargs: dict, registry: dict) -> None:
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
        problems.lines.extend(problems_from(exc, prefix="kwargs", model=registry[parsed.attr]))


class TargetSpec(_Spec):
    """A callable to build: ``target`` and its ``kwargs``; a built-in's kwargs are checked against
    ``BUILTINS`` (its kwargs models), so a misspelled one is refused at submit."""

    BUILTINS: ClassVar[dict[str, type[BaseModel]]] = BUILTIN_DATA
    target: str = Field(description="'builtin:NAME' (where built-ins exist) or 'package.module:callable'.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the target.")

    @model_validator(mode="after")
    def _target(self) -> "TargetSpec":
        problems = Problems()
        check_target(problems, self.target, self.kwargs, self.BUILTINS)
        problems.raise_if_any()
        return self


class ModelSpec(TargetSpec):
    BUILTINS: ClassVar[dict[str, type[BaseModel]]] = BUILTIN_MODELS
    target: str = Field(description="'builtin:mlp', 'builtin:cnn', 'builtin:char_transformer' or "
                                    "'package.module:callable' returning an nn.Module.")


class DataSpec(_Spec):
    target: str = Field(
        description="'builtin:spiral', 'builtin:digits', 'builtin:diabetes', 'builtin:stdlib_text' or "
        "'package.module:callable' returning a Dataset: map-style "
        "(__getitem__/__len__; samples of any structure of tensors) or an IterableDataset (a stream, whose position "
        "is restored through its state_dict()/load_state_dict()). It receives the job's seed as `seed` if it accepts one."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the target.")
    val: Optional[TargetSpec] = Field(
        None, description="A separate validation data set {target, kwargs} (a team's own fixed split); replaces "
        "val_fraction. Built like `target`: 'builtin:NAME' or 'package.module:callable'.")
    collate: Optional[TargetSpec] = Field(
        None, description="'package.module:callable' merging a list of samples into a batch, called as "
        "callable(samples, **kwargs); default: PyTorch's default_collate.")
    batch_size: int = Field(64, gt=0, le=1_000_000, description="Samples per micro-batch.")
    val_batch_size: Optional[int] = Field(None, gt=0, description="Validation batch size; defaults to batch_size.")
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes (part of the reproducible configuration).")
    val_fraction: Optional[float] = Field(
        None, gt=0.0, lt=1.0,
        description=f"Share of a map-style data set held out for validation (split by seed); default {DEFAULT_VAL_FRACTION} "
        "unless `val` names a validation set.")

    @model_validator(mode="after")
    def _target(self) -> "DataSpec":
        problems = Problems()
        check_target(problems, self.target, self.kwargs, BUILTIN_DATA)
        if self.collate is not None and parse_target(self.collate.target).is_builtin:
            problems.add("collate.target", "there are no built-in collate functions; name 'package.module:callable'")
        if self.val is not None and self.val_fraction is not None:
            problems.add("val_fraction", "give either val (a validation data set) or val_fraction (a held-out share), not both")
        problems.raise_if_any()
        return self

    @property
    def holdout_fraction(self) -> Optional[float]:
        """The share held out of the training data, or None when `val` is a separate set."""
        if self.val is not None:
            return None
        return self.val_fraction if self.val_fraction is not None else DEFAULT_VAL_FRACTION


class TaskSpec(TargetSpec):
    BUILTINS: ClassVar[dict[str, type[BaseModel]]] = BUILTIN_TASKS
    target: str = Field(
        "builtin:classification",
        description="How a batch becomes a loss and how validation is scored: 'builtin:classification' (cross-entropy; "
        "val_loss, val_accuracy), 'builtin:regression' (MSE; val_loss = MSE, val_mae), 'builtin:language_model' "
        "(next-token cross-entropy; val_loss per token, val_perplexity, val_accuracy per token), or "
        "'package.module:callable' returning an object with loss(model, batch), metrics() and score(model, batch, metrics).")

    def builtin_metrics(self) -> Optional[dict[str, str]]:
        """``{"val_NAME": mode}`` for a built-in task; None for a user task (known only when it is built)."""
        target = parse_target(self.target)
        if not target.is_builtin:
            return None
        return {**builtin_task_metrics(target.attr, self.kwargs), "train_loss": "min"}


class OptimizerSpec(_Spec):
    name: Literal["adamw", "adam", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(gt=0.0, le=10.0, description="Learning rate (OneCycle's peak).")
    weight_decay: float = Field(0.0, ge=0.0, lt=1.0, description="Weight decay (decoupled for adamw).")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="Momentum; sgd only.")
    # strict=False: JSON and YAML carry a pair as a list
    betas: tuple[float, float] = Field((0.9, 0.999), strict=False, description="Adam betas; adam/adamw only.")
    no_decay_bias_and_norm: bool = Field(
        False, description="Put parameters with fewer than 2 dimensions (biases, LayerNorm/BatchNorm weights) in a "
        "parameter group without weight decay (LM practice).")

    @model_validator(mode="after")
    def _fits_optimizer(self) -> "OptimizerSpec":
        problems = Problems()
        if self.momentum and self.name != "sgd":
            problems.add("momentum", f"only sgd uses momentum (name is {self.name!r}); for adam use betas")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            problems.add("betas", f"each must be in [0, 1) (got {list(self.betas)})")
        problems.raise_if_any()
        return self


PER_STEP_SCHEDULERS = ("onecycle", "warmup_cosine", "constant_warmup")


class SchedulerSpec(_Spec):
    name: Literal["onecycle", "warmup_cosine", "constant_warmup", "cosine", "step", "none"] = Field(
        "none", description="Per optimizer step: onecycle; warmup_cosine (linear warmup, then cosine to "
        "min_lr_ratio); constant_warmup (linear warmup, then constant). Per epoch: cosine and step.")
    warmup_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="onecycle, warmup_cosine, constant_warmup: share of the run's optimizer "
        "steps spent warming up (unless warmup_steps is given).")
    warmup_steps: Optional[int] = Field(
        None, ge=0, description="warmup_cosine, constant_warmup: optimizer steps of linear warmup (overrides warmup_fraction).")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine, warmup_cosine: final lr as a fraction of optimizer.lr.")
    step_epochs: int = Field(10, gt=0, description="step: epochs between decays.")
    gamma: float = Field(0.1, gt=0.0, le=1.0, description="step: decay factor.")
    cycle_momentum: bool = Field(
        True, description="onecycle only: also cycle momentum inversely to the lr, as PyTorch's OneCycleLR does by "
        "default. This OVERRIDES the optimizer's momentum, and for adam/adamw its beta1 (between 0.85 and 0.95); set "
        "false to keep optimizer.betas / momentum as given.")

    @property
    def per_step(self) -> bool:
        """Whether the scheduler steps after every optimizer step (else once per epoch)."""
        return self.name in PER_STEP_SCHEDULERS


def schedule_problems(scheduler: SchedulerSpec, max_steps: Optional[int]) -> list[str]:
    """A per-step schedule that cannot fit a step-based run (checked again at job start, where an
    epoch-based run's length becomes known)."""
    if max_steps is None:
        return []
    if scheduler.name in ("warmup_cosine", "constant_warmup") and scheduler.warmup_steps is not None \
            and scheduler.warmup_steps >= max_steps:
        return [f"scheduler.warmup_steps: a warmup of {scheduler.warmup_steps} steps leaves none of the run's "
                f"{max_steps} (loop.max_steps) for the schedule; shorten the warmup or train longer"]
    if scheduler.name == "onecycle" and (scheduler.warmup_fraction * max_steps < 2
                                         or (1 - scheduler.warmup_fraction) * max_steps < 2):
        return [f"scheduler.warmup_fraction: {scheduler.warmup_fraction} of the run's {max_steps} steps "
                "(loop.max_steps) leaves fewer than 2 steps for warmup or for annealing"]
    return []


class LoopSpec(_Spec):
    epochs: Optional[int] = Field(
        None, gt=0, le=100_000, description="Passes over the training data; validation after each. Give epochs or max_steps.")
    max_steps: Optional[int] = Field(
        None, gt=0, le=100_000_000, description="Step-based run: optimizer steps in all, passing over the data as often "
        "as needed; validation every eval_every_steps and at the end. Give epochs or max_steps.")
    eval_every_steps: Optional[int] = Field(
        None, gt=0, description="Also validate (and checkpoint, and consider for best) every N optimizer steps.")
    grad_accum_steps: int = Field(1, gt=0, le=1024, description="Micro-batches per optimizer step.")
    max_grad_norm: Optional[float] = Field(1.0, gt=0.0, description="Clip the global gradient norm to this; null disables clipping.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="bf16/fp16 run under autocast; fp16 adds a GradScaler (CUDA only).")
    deterministic: bool = Field(True, description="Deterministic algorithms and pinned threads: the condition for bit-exact resume.")
    nonfinite: Literal["fail", "skip"] = Field(
        "fail", description="On a NaN/inf loss: fail the job, or skip that optimizer step and count it."
    )

    @model_validator(mode="after")
    def _length(self) -> "LoopSpec":
        problems = Problems()
        if (self.epochs is None) == (self.max_steps is None):
            problems.add("epochs", "give exactly one of epochs (passes over the data) or max_steps (optimizer steps)")
        if self.max_steps is not None and self.eval_every_steps is not None and self.eval_every_steps > self.max_steps:
            problems.add("eval_every_steps", f"{self.eval_every_steps} is beyond max_steps {self.max_steps}")
        problems.raise_if_any()
        return self


class CheckpointSpec(_Spec):
    every_steps: Optional[int] = Field(100, gt=0, description="Mid-epoch checkpoint every N optimizer steps; null: epoch ends only.")
    min_interval_s: float = Field(
        1.0, ge=0, description="A mid-epoch (every_steps) checkpoint, or a validation's that is not a new best, due "
        "sooner than this many seconds after the last one taken is skipped: a fast loop's checkpoints cost Redis and "
        "the store by time, not by step rate. A new best, a yield, a pause and the run's end are always "
        "checkpointed; 0: every one due is taken.")
    keep_last: int = Field(3, description="Step checkpoints kept (the best one is kept apart).")
    monitor: str = Field(
        "val_loss", pattern=MONITOR_PATTERN,
        description="Metric that picks the best checkpoint: train_loss or any val_NAME the task reports.")
    mode: Optional[Literal["min", "max"]] = Field(
        None, description="Whether a lower or a higher monitored value is better; built-in tasks' metrics have a known "
        "direction (and a wrong mode is refused), a user task's metric needs it stated.")
    memory_every_steps: Union[Literal["auto", "off"], int] = Field(
        "auto", description="On a baton worker, the state of a single-process job is also copied into the worker's "
        "host memory every N optimizer steps: if the training process dies (a signal, out of memory) the worker "
        "resumes the job from that copy at once, instead of from the last durable checkpoint. auto: N is the "
        "smallest that keeps the copies within 3% of training time; off: no copies.")

    @field_validator("memory_every_steps")
    @classmethod
    def _positive_interval(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("must be auto, off or a number of steps >= 1")
        return value

    @model_validator(mode="after")
    def _sane(self) -> "CheckpointSpec":
        problems = Problems()
        if self.keep_last < 2:
            problems.add("keep_last", "must be >= 2 (the newest checkpoint may still be uploading when an older one is needed)")
        problems.raise_if_any()
        return self


def monitor_problems(task: TaskSpec, monitor: str, mode: Optional[str]) -> list[str]:
    """Whether the task reports ``monitor`` (built-in tasks: known at submit) and ``mode`` fits it."""
    known = task.builtin_metrics()
    if known is None:  # a user task: its metrics are checked when the job starts
        if mode is None and monitor not in ("train_loss", "val_loss"):
            return [f"checkpoint.mode: state whether {monitor} is better low (min) or high (max)"]
        return []
    if monitor not in known:
        return [f"checkpoint.monitor: {monitor!r} is not reported by task {task.target}; choose one of {sorted(known)}"]
    if mode is not None and mode != known[monitor]:
        return [f"checkpoint.mode: {monitor} improves when it goes {'down' if known[monitor] == 'min' else 'up'}; "
                f"use mode: {known[monitor]}"]
    return []


def _monitor_problems_of_raw(data: dict) -> list[str]:
    """The monitor's problems of a spec that failed elsewhere (so that every problem is reported at once)."""
    try:
        task = TaskSpec.model_validate(data.get("task") or {})
        checkpoint = data.get("checkpoint") or {}
        monitor, mode = checkpoint.get("monitor", "val_loss"), checkpoint.get("mode")
    except (ValidationError, AttributeError):
        return []
    if not isinstance(monitor, str) or mode not in (None, "min", "max"):
        return []
    return monitor_problems(task, monitor, mode)


class JobSpec(_Spec):
    name: str = Field(pattern=NAME_PATTERN, description="Human-readable job name.")
    seed: int = Field(0, ge=0, lt=2**63, description="Seeds weights, the split, shuffling, dropout and augmentation.")
    model: ModelSpec = Field(description="What to train.")
    data: DataSpec = Field(description="What to train on.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="How a batch becomes a loss, and how validation is scored.")
    optimizer: OptimizerSpec = Field(description="How to update the weights.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec, description="Learning-rate schedule.")
    loop: LoopSpec = Field(description="The training loop.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="When to checkpoint, what to keep.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="Where the job runs.")
    retry: RetrySpec = Field(default_factory=RetrySpec, description="How often infrastructure loss is retried.")
    code: Optional[CodeSpec] = Field(None, description="Your code shipped with the job (else the workers import "
                                                       "what they have installed).")

    @model_validator(mode="after")
    def _cross_field(self) -> "JobSpec":
        problems = Problems()
        if self.loop.precision == "fp16" and self.resources.device != "cuda":
            problems.add("loop.precision", "fp16 needs resources.device: cuda (use bf16 on the CPU)")
        if self.scheduler.name == "onecycle" and self.scheduler.warmup_fraction == 0.0:
            problems.add("scheduler.warmup_fraction", "onecycle needs a warmup > 0")
        if self.loop.max_steps is not None and self.scheduler.name in ("cosine", "step"):
            problems.add("scheduler.name", f"{self.scheduler.name} steps once per epoch; a step-based run (loop.max_steps) "
                                           "needs a per-step schedule: warmup_cosine, constant_warmup, onecycle or none")
        problems.lines.extend(schedule_problems(self.scheduler, self.loop.max_steps))
        if self.resources.reshard and self.resources.strategy != "fsdp":
            problems.add("resources.reshard", "only sharded checkpoints (resources.strategy: fsdp) can be resharded "
                                              "onto another number of ranks")
        if self.resources.strategy == "fsdp" and self.loop.precision == "fp16":
            problems.add("loop.precision", "fsdp trains in bf16 or fp32 (fp16's GradScaler would see each rank's "
                                           "shard of the gradients alone); use bf16")
        if self.resources.ranks > 1 and self.loop.nonfinite == "skip":
            problems.add("loop.nonfinite", "skip is not supported with resources.processes > 1 (a rank skipping its "
                                           "backward would desynchronise the ranks' gradient all-reduce); use fail")
        problems.lines.extend(monitor_problems(self.task, self.checkpoint.monitor, self.checkpoint.mode))
        problems.raise_if_any()
        return self

    @property
    def monitor_mode(self) -> str:
        """The best checkpoint's direction: as stated, else the built-in metric's, else min (losses)."""
        if self.checkpoint.mode is not None:
            return self.checkpoint.mode
        known = self.task.builtin_metrics() or {}
        return known.get(self.checkpoint.monitor, "min")

    def user_targets(self) -> dict[str, str]:
        """Every target this spec names, by field (``{"model.target": "pkg.mod:fn", ...}``)."""
        found = {"model.target": self.model.target, "data.target": self.data.target, "task.target": self.task.target}
        if self.data.val is not None:
            found["data.val.target"] = self.data.val.target
        if self.data.collate is not None:
            found["data.collate.target"] = self.data.collate.target
        return found

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
            lines = problems_from(exc, model=cls)
            raise SpecError(lines + [p for p in _monitor_problems_of_raw(data) if p not in lines]) from None
