"""The keyword arguments of baton's built-in models and data sets, validated at submit.

The implementations live in ``workers.builtins``; these models only describe what each accepts,
so a misspelled or out-of-range kwarg is caught before anything is queued.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Kwargs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MlpKwargs(_Kwargs):
    in_features: int = Field(2, gt=0, description="Input width.")
    hidden: int = Field(128, gt=0, description="Width of each hidden layer.")
    out_features: int = Field(3, gt=1, description="Number of classes.")
    layers: int = Field(2, ge=1, le=16, description="Number of hidden layers.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout after each hidden layer.")


class CnnKwargs(_Kwargs):
    in_channels: int = Field(1, gt=0, description="Input channels.")
    num_classes: int = Field(10, gt=1, description="Number of classes.")
    channels: int = Field(16, gt=0, description="Channels of the first conv block (the second has twice).")
    image_size: int = Field(8, ge=4, description="Height and width of the (square) input; divisible by 2.")
    dropout: float = Field(0.25, ge=0.0, lt=1.0, description="Dropout before the classifier.")


class SpiralKwargs(_Kwargs):
    n_per_class: int = Field(1000, gt=0, le=1_000_000, description="Points per class.")
    classes: int = Field(3, ge=2, le=32, description="Number of spiral arms (classes).")
    noise: float = Field(0.2, ge=0.0, description="Gaussian noise added to each point's angle at generation.")
    jitter: float = Field(
        0.0, ge=0.0,
        description="Training-time augmentation: Gaussian jitter added to each sample, drawn from a "
        "generator seeded by (seed, epoch, index), so it is the same for any num_workers.",
    )


class DigitsKwargs(_Kwargs):
    jitter: float = Field(
        0.0, ge=0.0,
        description="Training-time augmentation: Gaussian pixel noise seeded by (seed, epoch, index).",
    )


BUILTIN_MODELS: dict[str, type[BaseModel]] = {"mlp": MlpKwargs, "cnn": CnnKwargs}
BUILTIN_DATA: dict[str, type[BaseModel]] = {"spiral": SpiralKwargs, "digits": DigitsKwargs}
