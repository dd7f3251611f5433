"""What a job's ``manifest.json`` holds: the committed checkpoints, newest last.

A checkpoint exists for readers only once it is listed here. The manifest is replaced whole,
with a compare-and-swap on its previous version, so a crash leaves the old or the new one.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

MANIFEST_VERSION = 1


class CheckpointEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="Object key relative to the store root.")
    step: int = Field(description="Optimizer steps completed when it was taken.")
    epoch: int = Field(description="Epoch the loop resumes in.")
    batch_in_epoch: int = Field(description="Batches of that epoch already consumed.")
    kind: Literal["step", "epoch", "eval", "stop"] = Field(description="step: every_steps; epoch: after an epoch's validation; eval: after an eval_every_steps or final validation; stop: preemption/cancel.")
    attempt: int = Field(description="The attempt that wrote it.")
    size: int = Field(description="Bytes.")
    sha256: str = Field(description="Hex digest of the bytes.")
    created_at: float = Field(description="Unix time of the commit.")


class BestEntry(CheckpointEntry):
    metric: str = Field(description="The monitored metric.")
    value: float = Field(description="Its value at this checkpoint.")


class CheckpointManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = MANIFEST_VERSION
    job_id: str
    attempt: int = Field(0, description="Highest attempt that has written this manifest; older attempts are fenced out.")
    checkpoints: list[CheckpointEntry] = Field(default_factory=list, description="Committed checkpoints, oldest first.")
    best: Optional[BestEntry] = None
    resumed_from: Optional[int] = Field(None, description="Step the current attempt resumed from; never rotated away.")
    completed: bool = Field(False, description="The job finished and its final artifacts are written.")

    @property
    def latest(self) -> Optional[CheckpointEntry]:
        return self.checkpoints[-1] if self.checkpoints else None
