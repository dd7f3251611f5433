"""Built-in data sets: ``builtin:spiral`` (generated from the seed), ``builtin:digits`` and
``builtin:diabetes`` (real, bundled with scikit-learn); ``builtin:stdlib_text`` is in ``text``.

Each here is a map-style Dataset of ``(input, target)``. A data set may define
``augment(x, generator)``: baton calls it for training samples only, with a generator seeded
by (seed, epoch, index), so augmentation is the same whatever the number of loader workers.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, TensorDataset

from baton.schemas.builtins import DiabetesKwargs, DigitsKwargs, SpiralKwargs
from baton.schemas.errors import PermanentError

from baton.workers.training import rng


class TensorPairs(TensorDataset):
    """Inputs and integer labels held in two tensors, with optional Gaussian jitter. A sample is
    torch's ``TensorDataset``'s ``(inputs[i], labels[i])``, so a batch without jitter is gathered
    in one indexing of each tensor (``baton.workers.training.data.TensorBatches``)."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, jitter: float = 0.0):
        super().__init__(inputs, labels)
        self.jitter = jitter
        if not jitter:  # nothing to augment: no per-sample generator is seeded for it (~10 us a sample)
            self.augment = None  # type: ignore[method-assign,assignment]  # the loader's cue: nothing to augment

    @property
    def inputs(self) -> torch.Tensor:
        return self.tensors[0]

    @property
    def labels(self) -> torch.Tensor:
        return self.tensors[1]

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return x + self.jitter * torch.randn(x.shape, generator=generator, dtype=x.dtype)


def spiral(seed: int = 0, **kwargs) -> Dataset:
    """The classic interleaved-spirals classification set: ``classes`` arms in the plane."""
    k = SpiralKwargs.model_validate(kwargs)
    gen = torch.Generator().manual_seed(seed)
    radius = torch.linspace(0.0, 1.0, k.n_per_class, dtype=torch.float64)
    points, labels = [], []
    for cls in range(k.classes):
        start = cls * 2 * math.pi / k.classes
        theta = torch.linspace(start, start + 4 * math.pi / k.classes * 1.5, k.n_per_class, dtype=torch.float64)
        theta = theta + k.noise * torch.randn(k.n_per_class, generator=gen, dtype=torch.float64)
        points.append(torch.stack([radius * torch.sin(theta), radius * torch.cos(theta)], dim=1))
        labels.append(torch.full((k.n_per_class,), cls, dtype=torch.long))
    return TensorPairs(torch.cat(points).float(), torch.cat(labels), k.jitter)


def digits(seed: int = 0, **kwargs) -> Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), scaled to [0, 1]."""
    k = DigitsKwargs.model_validate(kwargs)
    try:
        with rng.kept_through_imports():
            from sklearn.datasets import load_digits
    except ImportError:
        raise PermanentError(
            "builtin:digits needs scikit-learn, which is not installed: pip install 'baton[digits]'"
        ) from None
    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return TensorPairs(images, torch.tensor(bunch.target, dtype=torch.long), k.jitter)


DIABETES_TRAIN = 342
"""scikit-learn's diabetes set has 442 patients: the first 342 train, the last 100 validate (a fixed split)."""


def diabetes(seed: int = 0, **kwargs) -> Dataset:
    """scikit-learn's bundled diabetes regression set: 10 standardized features -> disease progression
    a year later, as ``(features (10,), target (1,))``. Targets are standardized with the training
    part's mean and standard deviation (``DiabetesKwargs``), so a model starts near the scale."""
    k = DiabetesKwargs.model_validate(kwargs)
    try:
        with rng.kept_through_imports():
            from sklearn.datasets import load_diabetes
    except ImportError:
        raise PermanentError(
            "builtin:diabetes needs scikit-learn, which is not installed: pip install 'baton[digits]'"
        ) from None
    bunch = load_diabetes()
    x = torch.tensor(bunch.data, dtype=torch.float32)
    y = torch.tensor(bunch.target, dtype=torch.float64).unsqueeze(1)
    train = slice(0, DIABETES_TRAIN)
    mean, std = y[train].mean(), y[train].std()
    y = ((y - mean) / std).float()
    part = train if k.part == "train" else slice(DIABETES_TRAIN, None)
    return TensorPairs(x[part], y[part])
