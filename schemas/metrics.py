"""One row of ``metrics.jsonl``: written after each validation, with the checkpoint it produced.

The task's validation metrics are flat ``val_NAME`` fields beside the fixed ones (classification:
``val_loss``, ``val_accuracy``), so a row reads the same in pandas, jq or a spreadsheet.
"""
from __future__ import annotations

import re
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Fields that depend only on the spec and the data (equal bit for bit after a resume), besides
# every val_NAME metric; the rest (timings, throughput) describe the machine.
DETERMINISTIC_FIELDS = ("epoch", "step", "train_loss", "train_curve", "lr_curve", "lr", "grad_norm", "grad_norm_max",
                        "nonfinite_steps")
VAL_FIELD = re.compile(r"^val_[a-z][a-z0-9_]*$")


def deterministic_part(row: dict) -> dict:
    """The fields of a row that a resumed run reproduces exactly."""
    return {k: v for k, v in row.items() if k in DETERMINISTIC_FIELDS or VAL_FIELD.match(k)}


def val_metrics(row: dict) -> dict[str, float]:
    """The task's validation metrics of a row, ``{"val_NAME": value}``."""
    return {k: v for k, v in row.items() if VAL_FIELD.match(k)}


class MetricsRow(BaseModel):
    # extra fields are the task's metrics, each val_NAME: a number (checked below)
    model_config = ConfigDict(extra="allow")

    epoch: int = Field(description="Epoch (pass over the training data) of this validation, counting from 1 as "
                       "everything baton shows does.")
    step: int = Field(description="Optimizer steps completed.")
    train_loss: float = Field(description="Mean training loss since the previous validation (the epoch), weighted by batch size.")
    train_curve: list[tuple[int, float]] = Field(
        default_factory=list, description="The training loss since the previous validation, step by step: (step, "
        "mean loss of the steps up to it) every total steps / 1000 steps, over every rank's samples.")
    lr_curve: list[tuple[int, float]] = Field(
        default_factory=list, description="The learning rate since the previous validation, step by step: (step, the "
        "rate of that step) at each point of train_curve.")
    lr: float = Field(description="Learning rate of the last optimizer step before this validation.")
    grad_norm: float = Field(description="Mean pre-clip global gradient norm over the epoch's steps.")
    grad_norm_max: float = Field(description="Largest pre-clip gradient norm of the epoch.")
    nonfinite_steps: int = Field(0, description="Optimizer steps skipped for a non-finite loss, so far.")
    samples_per_s: float = Field(description="Training throughput over the epoch (machine-dependent).")
    epoch_s: float = Field(0.0, description="Wall time of the epoch (machine-dependent; resumed epochs count from the resume).")
    time: float = Field(0.0, description="Unix time at which the row was recorded (trackers stamp the row's metrics with it).")
    checkpoint: Optional[str] = Field(None, description="Object key of the checkpoint taken after this validation; null "
                                      "where none was (not a new best, within checkpoint.min_interval_s of the last).")
    is_best: bool = Field(False, description="Whether this validation improved the monitored metric.")
    ckpt_count: int = Field(0, description="Checkpoints committed since the previous row (this attempt).")
    ckpt_skipped: int = Field(0, description="Checkpoints skipped so far (periodic ones, or a validation's that is not a new "
                              "best) because one was still in flight or the last was taken less than "
                              "checkpoint.min_interval_s before.")
    ckpt_stall_s: float = Field(0.0, description="Seconds the loop was blocked snapshotting those checkpoints.")
    ckpt_write_s: float = Field(0.0, description="Seconds spent serializing, uploading and committing them (in the background).")
    ckpt_bytes: int = Field(0, description="Bytes of those checkpoints.")

    @model_validator(mode="after")
    def _task_metrics(self) -> "MetricsRow":
        for name, value in (self.model_extra or {}).items():
            if not VAL_FIELD.match(name) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name}: a metrics row's extra fields are the task's metrics, val_NAME: number")
        return self
