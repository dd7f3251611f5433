"""Validation: eval mode, no autograd, the task's torchmetrics metrics over the whole set."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from .amp import Precision
from .batches import to_device
from .task_api import BoundTask


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, precision: Precision,
             task: BoundTask) -> dict[str, float]:
    """``{"val_NAME": value}`` for every metric of the task; the model's mode is restored afterwards."""
    was_training = model.training
    model.eval()
    metrics = task.new_metrics(device)
    batches = 0
    try:
        with torch.no_grad():
            for batch in loader:
                batch = to_device(batch, device)
                with precision.autocast():
                    task.score(model, batch, metrics)
                batches += 1
    finally:
        model.train(was_training)
    if batches == 0:
        raise ValueError("the validation set is empty")
    return task.compute(metrics)
