"""Built-in models: ``builtin:mlp`` and ``builtin:cnn``."""
from __future__ import annotations

from torch import nn

from baton.schemas.builtins import CnnKwargs, MlpKwargs


def mlp(**kwargs) -> nn.Module:
    """Fully connected classifier: ``layers`` x (Linear, ReLU, Dropout), then a Linear head."""
    k = MlpKwargs.model_validate(kwargs)
    blocks: list[nn.Module] = []
    width = k.in_features
    for _ in range(k.layers):
        blocks += [nn.Linear(width, k.hidden), nn.ReLU(), nn.Dropout(k.dropout)]
        width = k.hidden
    blocks.append(nn.Linear(width, k.out_features))
    return nn.Sequential(*blocks)


def cnn(**kwargs) -> nn.Module:
    """Two conv blocks (Conv, BatchNorm, ReLU), a 2x2 max-pool, Dropout and a Linear head."""
    k = CnnKwargs.model_validate(kwargs)
    c1, c2 = k.channels, 2 * k.channels
    pooled = k.image_size // 2
    return nn.Sequential(
        nn.Conv2d(k.in_channels, c1, 3, padding=1, bias=False),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1, bias=False),
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(k.dropout),
        nn.Linear(c2 * pooled * pooled, k.num_classes),
    )
