"""A job's attempt history as the timeline draws it: its events (``storage/records/events.py``), each
resume with how long the job was without a worker and how many steps it had to train again."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, Optional

from baton.storage.records.events import Event

ENDS = ("lost", "lapsed", "yielded", "requeued")
"""Events after which the job waits for a worker: a gap runs from one to the next claim (a cancel ends it)."""


def timeline(events: list[Event]) -> list[dict[str, Any]]:
    """Rows oldest first: every event, a claim after a loss or a yield with ``gap_s`` (seconds without a
    worker: from when the lost worker last reported progress, or from the yield) and a resume after a loss
    with ``redone``: the steps the lost attempt had reported past its resume point (at least that many are
    trained again: a worker reports its step about once a second)."""
    rows: list[dict[str, Any]] = []
    stopped: Optional[Event] = None  # the last loss or yield not yet followed by a claim
    lost_at_step: Optional[int] = None  # the step reached before the last loss
    for event in events:
        row = asdict(event)
        if event.kind in ENDS:
            stopped = event
            if event.kind != "requeued":
                lost_at_step = event.step if event.kind in ("lost", "lapsed") else None
        elif event.kind == "cancelled":
            stopped = None
        elif event.kind == "claimed" and stopped is not None:
            row["gap_s"] = round(event.t - (stopped.heard or stopped.t), 3)
            row["after"] = stopped.kind
            stopped = None
        elif event.kind == "resumed":
            if lost_at_step is not None and event.step is not None:
                row["redone"] = max(0, lost_at_step - event.step)
            lost_at_step = None
        rows.append(row)
    return rows
