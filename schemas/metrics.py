"""One row of ``metrics.jsonl``: written after each validation, with the checkpoint it produced."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

# Fields that depend only on the spec and the data (equal bit for bit after a resume); the
# rest (timings, throughput) describe the machine.
DETERMINISTIC_FIELDS = ("epoch", "step", "train_loss", "val_loss", "val_accuracy", "lr",
                        "grad_norm", "grad_norm_max", "nonfinite_steps")


class MetricsRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int = Field(description="Epoch just finished (0-based).")
    step: int = Field(description="Optimizer steps completed.")
    train_loss: float = Field(description="Per-sample mean training loss over the epoch.")
    val_loss: float = Field(description="Per-sample mean validation loss.")
    val_accuracy: float = Field(description="Share of validation samples classified correctly.")
    lr: float = Field(description="Learning rate of the last optimizer step of the epoch.")
    grad_norm: float = Field(description="Mean pre-clip global gradient norm over the epoch's steps.")
    grad_norm_max: float = Field(description="Largest pre-clip gradient norm of the epoch.")
    nonfinite_steps: int = Field(0, description="Optimizer steps skipped for a non-finite loss, so far.")
    samples_per_s: float = Field(description="Training throughput over the epoch (machine-dependent).")
    epoch_s: float = Field(0.0, description="Wall time of the epoch (machine-dependent; resumed epochs count from the resume).")
    checkpoint: Optional[str] = Field(None, description="Object key of the checkpoint taken after this validation.")
    is_best: bool = Field(False, description="Whether this validation improved the monitored metric.")
    ckpt_count: int = Field(0, description="Checkpoints committed since the previous row (this attempt).")
    ckpt_skipped: int = Field(0, description="Periodic checkpoints skipped so far because one was still in flight.")
    ckpt_stall_s: float = Field(0.0, description="Seconds the loop was blocked snapshotting those checkpoints.")
    ckpt_write_s: float = Field(0.0, description="Seconds spent serializing, uploading and committing them (in the background).")
    ckpt_bytes: int = Field(0, description="Bytes of those checkpoints.")
