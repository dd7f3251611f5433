"""Built-in tasks: ``builtin:classification`` (the default), ``builtin:regression``,
``builtin:language_model``. See ``baton.workers.training.task_api`` for the protocol.

Each refuses outputs and targets it cannot score, naming their shapes, rather than training on a
loss that is constant by construction (cross-entropy over one class is identically 0).
Validation metrics accumulate in float64 and average per scored unit: per sample for
classification and regression, per token for a language model.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MeanAbsoluteError, MeanMetric, MeanSquaredError, Metric
from torchmetrics.classification import MulticlassF1Score
from torchmetrics.text import Perplexity

from baton.schemas.builtins import ClassificationKwargs, LanguageModelKwargs, RegressionKwargs

from baton.workers.training.batches import describe


def _mean() -> MeanMetric:
    # nan_strategy "disable": a NaN loss must show as NaN, not be dropped with a warning
    return MeanMetric(nan_strategy="disable").set_dtype(torch.float64)


def inputs_and_targets(batch: Any) -> tuple[Any, Tensor]:
    """``(inputs, targets)``, ``[inputs, targets]`` or ``{"input": ..., "target": ...}``."""
    if isinstance(batch, Mapping) and "input" in batch and "target" in batch:
        return batch["input"], batch["target"]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(f"expected a batch of (inputs, targets) or {{'input': ..., 'target': ...}}; got {describe(batch)}")


def _shape(t: Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


class BuiltinTask:
    """What the built-in tasks share: their metrics keep all their state in torchmetrics'
    ``add_state``, so ``reset()`` restores them exactly and baton reuses them (``reusable_metrics``
    in ``baton.workers.training.task_api``)."""

    reusable_metrics = True


class Classification(BuiltinTask):
    """Cross-entropy over class logits ``(B, C)`` or ``(B, C, d1, ...)`` against integer labels."""

    def __init__(self, **kwargs):
        self.options = ClassificationKwargs.model_validate(kwargs)

    @staticmethod
    def check(logits: Tensor, targets: Tensor) -> None:
        if logits.dim() < 2 or logits.shape[1] < 2:
            raise ValueError(f"model output {_shape(logits)} is not class logits (B, C>=2, ...): cross-entropy over "
                             "one class is identically 0, so nothing could be learned; for real-valued targets use "
                             "task builtin:regression")
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise ValueError(f"targets {_shape(targets)} are not integer class labels; for real-valued targets use "
                             "task builtin:regression")
        expected = (logits.shape[0], *logits.shape[2:])
        if tuple(targets.shape) != expected:
            raise ValueError(f"targets {_shape(targets)} do not match logits {_shape(logits)}: "
                             f"expected labels of shape {list(expected)}")

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = inputs_and_targets(batch)
        logits = model(inputs)
        self.check(logits, targets)
        return F.cross_entropy(logits, targets)

    def metrics(self) -> dict[str, Metric]:
        metrics: dict[str, Metric] = {"loss": _mean(), "accuracy": _mean()}
        if self.options.num_classes is not None:
            metrics["macro_f1"] = MulticlassF1Score(num_classes=self.options.num_classes, average="macro")
        return metrics

    def score(self, model: nn.Module, batch: Any, metrics: dict[str, Metric]) -> None:
        inputs, targets = inputs_and_targets(batch)
        logits = model(inputs)
        self.check(logits, targets)
        metrics["loss"].update(F.cross_entropy(logits.float(), targets, reduction="none"))
        predicted = logits.argmax(dim=1)
        metrics["accuracy"].update((predicted == targets).double())
        if "macro_f1" in metrics:
            metrics["macro_f1"].update(predicted, targets)


class Regression(BuiltinTask):
    """Mean squared error between the model's output and real-valued targets of the same shape."""

    def __init__(self, **kwargs):
        RegressionKwargs.model_validate(kwargs)

    @staticmethod
    def check(outputs: Tensor, targets: Tensor) -> None:
        if not targets.is_floating_point():
            raise ValueError(f"targets {_shape(targets)} are not real-valued; for class labels use task "
                             "builtin:classification")
        if outputs.shape != targets.shape:
            raise ValueError(f"model output {_shape(outputs)} and targets {_shape(targets)} differ in shape "
                             "(they would broadcast into a wrong loss); make them equal, e.g. targets of (B, 1) "
                             "for a model with one output")

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = inputs_and_targets(batch)
        outputs = model(inputs)
        self.check(outputs, targets)
        return F.mse_loss(outputs, targets)

    def metrics(self) -> dict[str, Metric]:
        return {"loss": MeanSquaredError().set_dtype(torch.float64), "mae": MeanAbsoluteError().set_dtype(torch.float64)}

    def score(self, model: nn.Module, batch: Any, metrics: dict[str, Metric]) -> None:
        inputs, targets = inputs_and_targets(batch)
        outputs = model(inputs)
        self.check(outputs, targets)
        outputs, targets = outputs.double(), targets.double()
        metrics["loss"].update(outputs, targets)
        metrics["mae"].update(outputs, targets)


class LanguageModel(BuiltinTask):
    """Next-token cross-entropy over logits ``(B, T, V)``.

    A batch is a token tensor ``(B, T+1)`` (inputs are ``[:, :-1]``, targets ``[:, 1:]``), a pair
    ``(inputs, targets)`` of ``(B, T)``, or a dict with ``input_ids`` (shifted like a tensor) or
    ``input``/``target``. Targets equal to ``ignore_index`` are not scored.
    """

    def __init__(self, **kwargs):
        self.options = LanguageModelKwargs.model_validate(kwargs)

    @staticmethod
    def split(batch: Any) -> tuple[Tensor, Tensor]:
        if isinstance(batch, Mapping) and "input_ids" in batch:
            batch = batch["input_ids"]
        if isinstance(batch, Tensor):
            if batch.dim() != 2 or batch.shape[1] < 2:
                raise ValueError(f"expected a token tensor (B, T+1); got {describe(batch)}")
            return batch[:, :-1], batch[:, 1:]
        return inputs_and_targets(batch)

    @staticmethod
    def check(logits: Tensor, targets: Tensor) -> None:
        if logits.dim() != 3 or logits.shape[2] < 2:
            raise ValueError(f"model output {_shape(logits)} is not next-token logits (B, T, V>=2)")
        if tuple(targets.shape) != tuple(logits.shape[:2]) or targets.is_floating_point():
            raise ValueError(f"targets {_shape(targets)} do not match logits {_shape(logits)}: expected integer "
                             f"token ids of shape {list(logits.shape[:2])}")

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        inputs, targets = self.split(batch)
        logits = model(inputs)
        self.check(logits, targets)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=self.options.ignore_index)

    def metrics(self) -> dict[str, Metric]:
        return {"loss": _mean(), "perplexity": Perplexity(ignore_index=self.options.ignore_index),
                "accuracy": _mean()}

    def score(self, model: nn.Module, batch: Any, metrics: dict[str, Metric]) -> None:
        inputs, targets = self.split(batch)
        logits = model(inputs).float()
        self.check(logits, targets)
        scored = targets != self.options.ignore_index
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none",
                                 ignore_index=self.options.ignore_index)
        metrics["loss"].update(losses[scored.flatten()])
        metrics["perplexity"].update(logits, targets)
        metrics["accuracy"].update((logits.argmax(dim=-1) == targets)[scored].double())

