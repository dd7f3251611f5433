"""What a worker does with each way an attempt can end (``baton.schemas.messages.Ending``): one table.

- ``finish``: the job is over (succeeded, cancelled): its record says so;
- ``fail``: the job's own code or spec failed: recorded with its traceback, never retried;
- ``release``: given back uncounted, queued at once as the next attempt (a stop after a checkpoint,
  storage away, another node shutting down);
- ``lose``: a worker loss, counted against ``retry.max_attempts``, queued at once as the next attempt
  (a rank or the training process died, this machine could not write a checkpoint, a hang, the job's
  shipped code arrived changed);
- ``pause``: the job stopped at the validation that reached its ``pause_at``, after its checkpoint: kept
  paused, not queued, until someone continues it (``baton resume``; a search's promotion);
- ``none``: fenced out: another attempt owns the job, nothing more is written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from baton.schemas.messages import Ending
from baton.schemas.status import JobState


@dataclass(frozen=True)
class Action:
    kind: Literal["finish", "fail", "release", "lose", "pause", "none"]
    word: str  # how the delivery ended, in one word (worker logs, metrics, tests)
    state: Optional[JobState] = None  # finish: the job's final state
    retried: Optional[str] = None  # release, lose: the label of the jobs-retried metric


ACTIONS: dict[Ending, Action] = {
    Ending.SUCCEEDED: Action("finish", "succeeded", state=JobState.succeeded),
    Ending.CANCELLED: Action("finish", "cancelled", state=JobState.cancelled),
    Ending.FAILED: Action("fail", "failed"),
    Ending.STOPPED: Action("release", "released", retried="preempted"),
    Ending.STORAGE: Action("release", "released", retried="storage"),
    Ending.NODE_RELEASED: Action("release", "released", retried="preempted"),
    Ending.RANK_LOST: Action("lose", "lost", retried="rank_lost"),
    Ending.CHECKPOINT_WRITE: Action("lose", "lost", retried="checkpoint_write"),
    Ending.CRASHED: Action("lose", "lost", retried="crashed"),
    Ending.STALLED: Action("lose", "stalled", retried="stalled"),
    Ending.CODE: Action("lose", "lost", retried="code"),
    Ending.PAUSED: Action("pause", "paused"),
    Ending.FENCED: Action("none", "fenced"),
}
"""Every ending's action (tests/workers/queue check that none is missing)."""
