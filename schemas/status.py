"""A job's state as users see it (``JobClient.status()``, ``baton status``)."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, Json


class JobState(str, Enum):
    queued = "queued"  # accepted, waiting for a worker
    running = "running"  # a worker holds its lease
    retrying = "retrying"  # its worker was lost or preempted; waiting for another
    succeeded = "succeeded"
    failed = "failed"  # its own code failed, or it was lost retry.max_attempts times
    cancelled = "cancelled"
    paused = "paused"  # stopped at a validation (its pause_at), its checkpoint committed: resumable, not queued

    @property
    def terminal(self) -> bool:
        return self in (JobState.succeeded, JobState.failed, JobState.cancelled)

    @property
    def at_rest(self) -> bool:
        """Ended, or paused: nothing will happen to it until someone acts."""
        return self.terminal or self is JobState.paused


class JobStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")

    @property
    def shown_state(self) -> str:
        """The state as people read it: a job waiting again after it yielded its worker is ``queued
        (yielded)``, not ``retrying`` (which says its worker was lost)."""
        return "queued (yielded)" if self.state is JobState.retrying and self.yielded else self.state.value

    id: str
    name: str
    state: JobState
    queue: str = "default"
    team: str = Field("default", description="The team whose worker slots it uses (resources.team).")
    priority: int = Field(0, description="Higher starts first (resources.priority).")
    position: Optional[int] = Field(None, description="1-based place among the waiting jobs of its queue, in the "
                                    "order they will start; None when not waiting. Worked out when the status is read.")
    starts_in_s: Optional[float] = Field(
        None, description="Estimated seconds until it starts, where the step rates of the jobs running on its queue "
        "allow an estimate (a place a running job will free); None otherwise.")
    attempt: int = Field(0, description="Attempts started (every claim by a worker starts one).")
    lost: int = Field(0, description="Attempts lost with their worker (SIGKILL, node gone); preemptions do not count.")
    yielded: bool = Field(False, description="Waiting again after it yielded its worker (a preemption, a drain, a "
                          "job of higher priority, a quota reclaim): nothing lost, nothing counted. Its state is "
                          "retrying; people see it as queued (yielded).")
    max_attempts: int = 1
    worker: Optional[str] = Field(None, description="The worker running (or last running) it.")
    pid: Optional[int] = Field(None, description="The process id of its training process, on the worker's host.")
    epoch: Optional[int] = Field(None, description="The epoch (pass over the data) being trained, counting from 1.")
    epochs: Optional[int] = Field(None, description="Epochs in all; None for a step-based run (loop.max_steps).")
    step: Optional[int] = None
    total_steps: Optional[int] = None
    loss: Optional[float] = None
    lr: Optional[float] = None
    samples_per_s: Optional[float] = None
    steps_per_s: Optional[float] = None
    val_loss: Optional[float] = None
    val_accuracy: Optional[float] = None
    metrics: Optional[Json[dict[str, float]]] = Field(
        None, description="The last validation's metrics, every val_NAME the job's task reports.")
    monitor: Optional[str] = Field(None, description="The metric the best checkpoint is chosen by (checkpoint.monitor).")
    latest_checkpoint: Optional[str] = None
    best_checkpoint: Optional[str] = None
    best_value: Optional[float] = None
    resumed_from: Optional[int] = Field(None, description="Step the current attempt resumed from.")
    pause_at: Optional[int] = Field(
        None, description="Where the job pauses, its checkpoint committed: at the end of this epoch (an epoch-based "
        "run) or at the first validation at or past this step (a step-based run); None: it trains to its end.")
    storage_url: Optional[str] = None
    sweep: Optional[str] = Field(None, description="The sweep (baton sweep) this job belongs to.")
    submitted_by: Optional[str] = Field(None, description="The user the pool's server submitted it for (`baton "
                                        "server`); None for a job submitted directly to Redis, by no one it proved.")
    overrides: Optional[Json[dict[str, Any]]] = Field(
        None, description="The --set overrides (or grid point) applied to its spec file, {dotted.path: value}.")
    last_event: Optional[str] = Field(None, description="Why the job last went back to the queue.")
    waiting: Optional[str] = Field(None, description="Why a waiting job is not running, in one line (jobs of higher "
                                   "priority ahead, its team at its quota, no live worker serving its queue). Worked "
                                   "out when the status is read.")
    stall_stacks: Optional[str] = Field(None, description="Every thread's stack when an attempt was last stopped "
                                        "for making no optimizer step in BATON_STALL_TIMEOUT_S.")
    error: Optional[str] = None
    failure: Optional[str] = Field(None, description="A failed job's cause, then only your own code's frames (what "
                                   "`baton status` shows); the whole traceback is `traceback`, and in `baton logs`.")
    traceback: Optional[str] = None
    created_at: Optional[float] = None
    updated_at: Optional[float] = None
