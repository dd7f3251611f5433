"""Validation: eval mode, no autograd, loss and accuracy averaged per sample."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from .amp import Precision


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, precision: Precision) -> tuple[float, float]:
    """(mean loss per sample, accuracy); the model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    count = 0
    try:
        with torch.no_grad():
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with precision.autocast():
                    logits = model(x)
                loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").double()
                correct += (logits.argmax(dim=1) == y).sum()
                count += len(y)
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("the validation split is empty")
    return loss_sum.item() / count, correct.item() / count
