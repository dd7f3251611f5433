"""The keyword arguments of baton's built-in models, data sets and tasks, validated at submit.

The implementations live in ``baton.workers.training.builtins``; these models only describe what each accepts,
so a misspelled or out-of-range kwarg is caught before anything is queued.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Kwargs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class MlpKwargs(_Kwargs):
    in_features: int = Field(2, gt=0, description="Input width.")
    hidden: int = Field(128, gt=0, description="Width of each hidden layer.")
    out_features: int = Field(3, gt=0, description="Outputs: classes (>= 2), or values for builtin:regression.")
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


class DiabetesKwargs(_Kwargs):
    part: Literal["train", "val"] = Field("train", description="The first 342 patients (train) or the last 100 (val).")


class StdlibTextKwargs(_Kwargs):
    part: Literal["train", "train_windows", "val"] = Field(
        "train", description="train: a stream of windows in a per-epoch seeded order; train_windows: the same windows "
        "as a map-style data set, which baton's loader shuffles (what a job of several ranks needs); val: the held-out "
        "windows in order.")
    block: int = Field(64, ge=8, le=4096, description="Tokens a model sees (windows are block + 1 bytes).")
    max_bytes: int = Field(2_000_000, ge=10_000, description="Bytes of source read, in sorted file order.")
    val_every: int = Field(20, ge=2, description="Every val_every-th window is validation (never trained on).")


class CharTransformerKwargs(_Kwargs):
    vocab: int = Field(256, gt=1, description="Token ids (256 for bytes).")
    block: int = Field(64, ge=2, le=4096, description="Longest context (learned positions).")
    width: int = Field(128, gt=0, description="Model width; divisible by heads.")
    layers: int = Field(2, ge=1, le=48, description="Transformer blocks.")
    heads: int = Field(4, ge=1, description="Attention heads.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout in attention and MLP.")


class ClassificationKwargs(_Kwargs):
    num_classes: Optional[int] = Field(
        None, gt=1, description="When set, validation also reports macro-averaged F1 (val_macro_f1) over this many classes.")


class RegressionKwargs(_Kwargs):
    pass


class LanguageModelKwargs(_Kwargs):
    ignore_index: int = Field(-100, description="Target token id that is not scored (padding).")


BUILTIN_MODELS: dict[str, type[BaseModel]] = {"mlp": MlpKwargs, "cnn": CnnKwargs, "char_transformer": CharTransformerKwargs}
BUILTIN_DATA: dict[str, type[BaseModel]] = {
    "spiral": SpiralKwargs, "digits": DigitsKwargs, "diabetes": DiabetesKwargs, "stdlib_text": StdlibTextKwargs,
}
BUILTIN_TASKS: dict[str, type[BaseModel]] = {
    "classification": ClassificationKwargs, "regression": RegressionKwargs, "language_model": LanguageModelKwargs,
}


def builtin_task_metrics(name: str, kwargs: dict) -> dict[str, str]:
    """The metrics a built-in task reports, ``{"val_NAME": "min" | "max"}`` (the direction that is better)."""
    if name == "classification":
        found = {"val_loss": "min", "val_accuracy": "max"}
        if kwargs.get("num_classes") is not None:
            found["val_macro_f1"] = "max"
        return found
    if name == "regression":
        return {"val_loss": "min", "val_mae": "min"}
    return {"val_loss": "min", "val_perplexity": "min", "val_accuracy": "max"}
