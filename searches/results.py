"""A search as people read it (``baton sweep-status``, ``JobClient.search_results``, its report): each
trial's parameters, state and standing (waiting, running to a rung, stopped at a rung, finished), its
metric at each rung, and the best trial."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import redis

from baton.schemas.errors import JobNotFound
from baton.schemas.status import JobState, JobStatus
from baton.storage.records import searches
from baton.storage.stores.base import ObjectStore

from baton.searches.driver import Driver, Plan, Trial, finite


@dataclass(frozen=True)
class TrialRow:
    number: int
    status: JobStatus
    params: dict[str, Any]
    standing: str  # "running to epoch 6", "stopped at epoch 2", "finished", "failed", ...
    rung_values: dict[int, Optional[float]] = field(default_factory=dict)  # rung (epochs or steps) -> metric


@dataclass(frozen=True)
class SearchResults:
    search_id: str
    state: str  # running | finished | failed | cancelled
    monitor: str
    mode: str
    unit: str
    rungs: list[int]
    trials: list[TrialRow]
    best: Optional[str]  # the best trial's job id, once the search has finished
    error: Optional[str] = None  # why it failed (no trial of its last rung succeeded, a trial's id was taken)

    @property
    def search_steps(self) -> int:
        """Optimizer steps its trials have trained so far (their records' step)."""
        return sum(row.status.step or 0 for row in self.trials)


def search_results(client: redis.Redis, search_id: str) -> SearchResults:
    """JobNotFound for an unknown search."""
    plan = Plan.load(client, search_id)
    if plan is None:
        raise JobNotFound(f"no search {search_id!r}")
    driver = Driver(client, search_id, _no_publish, _no_store)  # (it only reads the trials' records)
    trials = driver.trials(plan)
    decided = {rung: searches.decision(client, search_id, rung) for rung in range(len(plan.rungs) - 1)}
    rows = []
    for number in sorted(trials):
        trial = trials[number]
        values = {}
        for rung, made in decided.items():
            if made is not None and str(number) in made["values"]:
                values[plan.rungs[rung]] = made["values"][str(number)]
            elif _asynchronous(plan) and (cached := searches.value(client, search_id, number, rung)) is not None:
                values[plan.rungs[rung]] = finite(cached)  # (asynchronous: no decision, the value read at its pause)
        rows.append(TrialRow(number, trial.status, trial.params, standing(plan, trial, decided), values))
    held = searches.meta(client, search_id)
    return SearchResults(search_id, plan.state, plan.monitor, plan.mode, plan.unit, plan.rungs, rows,
                         held.get("best") or None, held.get("error") or None)


def _no_publish(job_id: str, attempt: int) -> None:
    raise AssertionError("reading a search publishes nothing")


def _no_store(url: str) -> ObjectStore:
    raise AssertionError("reading a search reads no store")


def standing(plan: Plan, trial: Trial, decided: dict[int, Optional[dict]]) -> str:
    status, unit = trial.status, plan.unit[:-1]
    if status.state is JobState.succeeded:
        return "finished"
    if status.state.terminal:
        return status.state.value
    if status.state is JobState.paused and _asynchronous(plan):
        return f"{'paused' if plan.state == 'running' else 'stopped'} at {unit} {status.pause_at}"
    if status.state is JobState.paused:
        rung = plan.rungs.index(status.pause_at) if status.pause_at in plan.rungs else None
        made = decided.get(rung) if rung is not None else None
        if made is not None and trial.number not in made["promoted"]:
            return f"stopped at {unit} {status.pause_at}"
        return f"paused at {unit} {status.pause_at}" + ("" if made is not None else ", waiting for its rung")
    to = status.pause_at if status.pause_at is not None else plan.end
    return f"{'running' if status.state is JobState.running else 'waiting'} to {unit} {to}"


def _asynchronous(plan: Plan) -> bool:
    return plan.search.halving is not None and plan.search.halving.asynchronous
