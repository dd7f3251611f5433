"""The pool server's answers as the objects the direct client returns, for the same displays: a grid sweep's
entries, a search's results, a queue's view. Pure decoding: no I/O."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from baton.jobs.sweeps import SweepEntry
from baton.schemas.status import JobStatus

JSON_FIELDS = ("metrics", "overrides")
"""The status's fields a record holds as JSON text, which the server's answer holds decoded."""


def as_status(answer: dict) -> JobStatus:
    return JobStatus.model_validate({key: json.dumps(value) if key in JSON_FIELDS and isinstance(value, dict) else value
                                     for key, value in answer.items() if value is not None})


def sweep_entries(answer: dict) -> list[SweepEntry]:
    return [SweepEntry(as_status(entry["status"]), entry["monitor"], entry["mode"]) for entry in answer["entries"]]


def search_results(answer: dict) -> Any:
    from baton.searches.results import SearchResults, TrialRow

    trials = [TrialRow(number=trial["number"], status=as_status(trial["status"]), params=trial["params"],
                       standing=trial["standing"], rung_values={int(rung): value for rung, value in
                                                                (trial.get("rung_values") or {}).items()})
              for trial in answer["trials"]]
    return SearchResults(**{**answer, "trials": trials})


def queue_view(answer: dict, quotas: dict[str, dict[str, int]]) -> SimpleNamespace:
    """What ``baton.jobs.display.queue_table`` reads of a ``baton.jobs.pool.QueueView``."""
    waiting = [SimpleNamespace(job_id=job["id"], name=job["name"], team=job["team"], priority=job["priority"],
                               position=job["position"], submitted_at=job["submitted_at"], slots=job["slots"],
                               submitted_by=job.get("submitted_by") or "", attempt=job["next_attempt"])
               for job in answer["waiting"]]
    running = [SimpleNamespace(**{"worker": None, "step": 0, "total_steps": None, "submitted_by": None, **status})
               for status in answer["running"]]
    state = SimpleNamespace(queue=answer["queue"], waiting=waiting, usage=answer["usage"],
                            quotas=answer.get("quotas") or quotas.get(answer["queue"], {}))
    reasons = {job["id"]: job["reason"] for job in answer["waiting"] if job.get("reason")}
    return SimpleNamespace(state=state, queue=answer["queue"], reasons=reasons, running=running,
                           workers=answer["workers"], drained=set(answer["drained"]),
                           yielded=frozenset(answer.get("yielded", ())))
