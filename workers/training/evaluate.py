"""Validation: eval mode, no autograd, the task's torchmetrics metrics over the whole set."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from baton.workers.training.amp import Precision
from baton.workers.training.batches import to_device
from baton.workers.training.task_api import BoundTask


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, precision: Precision,
             task: BoundTask, forwards: Optional[int] = None) -> dict[str, float]:
    """``{"val_NAME": value}`` for every metric of the task; the model's mode is restored afterwards.

    ``forwards``: run the model this many times in all (a sharded job's ranks must: every forward
    gathers parameters from every rank, and their validation shards may differ by a batch): the
    rank's last batch is scored again into spare metrics, never computed, until the count is reached."""
    was_training = model.training
    model.eval()
    metrics = task.new_metrics(device)
    spare = task.spare_metrics(device) if forwards is not None else None
    batches = 0
    batch = None
    try:
        with torch.no_grad():
            for batch in loader:
                batch = to_device(batch, device)
                with precision.autocast():
                    task.score(model, batch, metrics)
                batches += 1
            for _ in range((forwards or 0) - batches):
                with precision.autocast():
                    task.score(model, batch, spare or {})  # into metrics that are never computed
    finally:
        model.train(was_training)
    if batches == 0:
        raise ValueError("the validation set is empty")
    return task.compute(metrics)
