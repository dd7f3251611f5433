"""What the training loop asks of whoever runs it, between optimizer steps.

``baton run`` answers from signal handlers; a Celery worker from its lease, the job record
(cancel) and SIGTERM. ``stop_reason`` may raise FencedOut: a fenced-out attempt must not even
write a last checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from baton.schemas.metrics import val_metrics


@dataclass(slots=True)
class StepReport:  # made after every step: a frozen dataclass's __init__ costs twice as much
    epoch: int
    epochs: Optional[int]  # None for a step-based run
    step: int
    total_steps: Optional[int]  # None: a stream's epochs, of unknown length
    loss: float  # the last micro-batch's training loss
    lr: float
    samples_per_s: float


class LoopControl:
    """The default: never stop, report nothing."""

    def stop_reason(self) -> Optional[str]:
        """None to go on, or why to checkpoint and stop ("preempted", "cancelled", "interrupted", "yielded")."""
        return None

    def on_step(self, report: StepReport) -> None:
        """Called after every optimizer step (keep it cheap)."""

    def on_epoch(self, row: dict) -> None:
        """Called after every validation with its metrics row."""

    def on_resume(self, step: int, epoch: int, batch_in_epoch: int, attempt: int, source: str = "checkpoint") -> None:
        """Called once when an attempt resumes: at ``epoch`` (an index: shown from 1) after ``batch_in_epoch``
        of its batches, from a durable checkpoint or (``source="memory"``) from the in-memory copy a
        crashed training process left on this machine."""
        self.log(f"resuming from {describe_source(source)}step {step} (epoch {epoch + 1}, batch {batch_in_epoch}) "
                 f"as attempt {attempt}")

    def log(self, message: str) -> None:
        print(message, flush=True)


def describe_source(source: str) -> str:
    """What a resume line says of where the state came from ("" for a durable checkpoint)."""
    return "the in-memory copy of " if source == "memory" else ""


def describe_row(row: dict) -> str:
    """One log line for a validation: where, the training loss and the task's metrics."""
    values = " ".join(f"{k} {v:.4f}" for k, v in val_metrics(row).items())
    return (f"epoch {row['epoch']}: step {row['step']} train_loss {row['train_loss']:.4f} {values}"
            f"{' *best' if row['is_best'] else ''}")
