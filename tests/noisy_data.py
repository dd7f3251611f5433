"""A data set whose ``__getitem__`` draws from the global RNGs (torch, numpy, python), outside
``augment()``: what defect 11 is about."""
from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset

from baton.workers.training.builtins.data import spiral


class GlobalNoise(Dataset):
    def __init__(self, base: Dataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        x, y = self.base[index]
        noise = 0.05 * torch.rand(x.shape) + 0.01 * float(np.random.rand()) + 0.01 * random.random()
        return x + noise.to(x.dtype), y


def noisy_spiral(seed: int = 0, **kwargs) -> Dataset:
    """The built-in spiral with noise drawn from the global RNGs in every ``__getitem__``."""
    return GlobalNoise(spiral(seed=seed, **kwargs))
