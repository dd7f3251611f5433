"""The task: how a batch becomes a training loss and how validation is scored.

A task is any object with three methods (built-ins in ``baton.workers.training.builtins.tasks``)::

    loss(model, batch) -> Tensor          # training: a scalar loss, averaged over the batch
    metrics() -> dict[str, Metric]        # validation: fresh torchmetrics metrics, by name
    score(model, batch, metrics) -> None  # validation: run the model on a batch, update the metrics

A task may also set ``reusable_metrics = True`` when every metric keeps all its state in
torchmetrics' ``add_state`` (the built-in tasks do): baton then resets and reuses the metrics from
one validation to the next instead of asking for new ones (making a metric costs ~0.15 ms, a reset
~0.02 ms). Leave it unset for a metric that keeps anything past ``reset()``.

baton keeps everything else: train/eval modes, no_grad for validation, zero_grad, the
accumulation divisor, autocast, the GradScaler, unscale and clipping, the scheduler's cadence,
the non-finite policy, checkpoints, RNG and the data position. A metric named ``NAME`` is
reported as ``val_NAME`` and may be ``checkpoint.monitor``.

``BoundTask`` wraps a task so that whatever it does wrong is reported as a ``TaskError`` naming
the task, the method and the batch it was given: a job fails once, it is not retried.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Protocol, runtime_checkable

import torch
from torch import nn
from torchmetrics import Metric

from baton.schemas.errors import UserCodeError

from baton.workers.training.batches import describe

METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")


@runtime_checkable
class Task(Protocol):
    """What a task provides (``from baton import Task``): annotate or subclass it, or just write the
    three methods; baton checks for them, not for this type."""

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Training, in train mode under autocast: a scalar loss, averaged over the batch."""

    def metrics(self) -> dict[str, Metric]:
        """Fresh torchmetrics metrics by name; each ``NAME`` is reported as ``val_NAME``."""

    def score(self, model: nn.Module, batch: Any, metrics: dict[str, Metric]) -> None:
        """Validation, in eval mode without autograd: run the model on a batch, update the metrics."""


class TaskError(UserCodeError):
    """The job's task failed or broke the task protocol (the job fails, it is not retried)."""


class BoundTask:
    """A task with its target's name, its metrics' names checked once, and guarded calls."""

    def __init__(self, task: Any, target: str):
        self.task, self.target = task, target
        for method in ("loss", "metrics", "score"):
            if not callable(getattr(task, method, None)):
                raise TaskError(f"task {target}: {type(task).__name__} has no method {method}(); "
                                "a task needs loss(model, batch), metrics() and score(model, batch, metrics)")
        self.metric_names = tuple(self._fresh_metrics())
        self._reusable = getattr(task, "reusable_metrics", False) is True
        self._kept: Optional[dict[str, Metric]] = None  # a reusable task's metrics, shared by its validations

    @property
    def reported(self) -> tuple[str, ...]:
        """Every metric a validation row carries from this task (``val_NAME``)."""
        return tuple(f"val_{name}" for name in self.metric_names)

    def _fresh_metrics(self) -> dict[str, Metric]:
        try:
            metrics = self.task.metrics()
        except Exception as exc:
            raise TaskError(f"task {self.target}: metrics() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(metrics, dict) or not metrics:
            raise TaskError(f"task {self.target}: metrics() must return a non-empty dict of name -> "
                            f"torchmetrics.Metric (got {type(metrics).__name__})")
        for name, metric in metrics.items():
            if not isinstance(name, str) or not METRIC_NAME.match(name):
                raise TaskError(f"task {self.target}: metric name {name!r} must match {METRIC_NAME.pattern} "
                                "(it is reported as val_<name>)")
            if not isinstance(metric, Metric):
                raise TaskError(f"task {self.target}: metric {name!r} is a {type(metric).__name__}, "
                                "not a torchmetrics.Metric")
        return metrics

    def new_metrics(self, device: torch.device) -> dict[str, Metric]:
        """Fresh metrics for each validation: a metric reused with ``reset()`` would carry whatever
        it keeps past a reset (state outside ``add_state``; FID's ``reset_real_features=False``)
        from one validation to the next, and a resumed run, which starts with fresh ones, would
        score differently from one never interrupted. A task with ``reusable_metrics`` declares
        that nothing is kept: its metrics are reset and reused (equal to fresh ones, cheaper)."""
        if self._kept is not None:  # a bound task validates on its attempt's one device
            for metric in self._kept.values():
                metric.reset()
            return self._kept
        metrics = self._fresh_metrics()
        if tuple(metrics) != self.metric_names:
            raise TaskError(f"task {self.target}: metrics() returned {list(metrics)}, earlier {list(self.metric_names)}; "
                            "it must name the same metrics every time")
        metrics = {name: metric.to(device) for name, metric in metrics.items()}
        if self._reusable:
            self._kept = metrics
        return metrics

    def spare_metrics(self, device: torch.device) -> dict[str, Metric]:
        """Metrics of this task that are never kept nor computed: what a sharded job's rank scores
        a batch into when it only runs the model to keep its ranks' forwards in step (``evaluate``)."""
        return {name: metric.to(device) for name, metric in self._fresh_metrics().items()}

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        try:
            loss = self.task.loss(model, batch)
        except Exception as exc:
            raise TaskError(f"task {self.target}: loss() raised {type(exc).__name__}: {exc} "
                            f"(batch: {describe(batch)})") from exc
        if not isinstance(loss, torch.Tensor):
            raise TaskError(f"task {self.target}: loss() returned a {type(loss).__name__}, not a tensor")
        if loss.dim() != 0:
            raise TaskError(f"task {self.target}: loss() returned a tensor of shape {list(loss.shape)}; "
                            "it must be a scalar (average the batch's losses)")
        if not loss.is_floating_point():
            raise TaskError(f"task {self.target}: loss() returned a {str(loss.dtype).removeprefix('torch.')} tensor; "
                            "it must be floating point")
        if not loss.requires_grad:
            raise TaskError(f"task {self.target}: loss() returned a tensor with no gradient: it is not computed from "
                            "the model's trainable parameters, so training could not change it")
        return loss

    def score(self, model: nn.Module, batch: Any, metrics: dict[str, Metric]) -> None:
        try:
            self.task.score(model, batch, metrics)
        except Exception as exc:
            raise TaskError(f"task {self.target}: score() raised {type(exc).__name__}: {exc} "
                            f"(batch: {describe(batch)})") from exc

    def compute(self, metrics: dict[str, Metric]) -> dict[str, float]:
        """``{"val_NAME": value}``; a metric that is not a single number is an error naming it."""
        values = {}
        for name, metric in metrics.items():
            try:
                value = metric.compute()
            except Exception as exc:
                raise TaskError(f"task {self.target}: metric {name!r} failed to compute: {type(exc).__name__}: {exc}") from exc
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise TaskError(f"task {self.target}: metric {name!r} computed a tensor of shape "
                                    f"{list(value.shape)}; a reported metric must be one number")
                value = value.item()
            if not isinstance(value, (int, float)):
                raise TaskError(f"task {self.target}: metric {name!r} computed a {type(value).__name__}, not a number")
            values[f"val_{name}"] = float(value)
        return values
