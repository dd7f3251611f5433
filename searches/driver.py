"""A search's next step, decided on complete information: whoever sees a trial change (the client that
submitted the search, the worker whose trial paused or ended, the reaper's pass) calls ``advance``; one of them at a time decides (a lock, and a poke counter so that no change goes unseen).

A step: sample the next round of trials once every earlier trial has reached the first rung (or ended);
at rung k, once every trial promoted into it is paused there (or ended), rank them by their metric at
that validation (ties by trial number), record the decision once, and continue the best 1/factor to the
next rung (the last to the run's end); the rest stay paused there, resumable. When every trial of the
last rung has ended, the best by its best value is the search's best. Nothing depends on which trial
got there first: the same search gives the same trials, stops, promotions and best."""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import redis

from baton.schemas.errors import SpecError
from baton.schemas.overrides import apply_overrides
from baton.schemas.search import SearchSpec
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobState, JobStatus
from baton.storage.artifacts import read_metrics
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.records import keys, searches
from baton.storage.records.connection import text
from baton.storage.records.creation import create_job
from baton.storage import failpoints
from baton.storage.records.job_records import JobRecords, spec_fields
from baton.storage.records.pausing import continue_job
from baton.storage.stores.base import ObjectStore

from baton.searches.sampling import Told, sample_round

_log = logging.getLogger("baton.search")
Publish = Callable[[str, int], None]
"""``(job id, attempt)``: publish the attempt a record was marked for."""


@dataclass(frozen=True)
class Plan:
    """A search as its record holds it."""

    search_id: str
    search: SearchSpec
    base: dict[str, Any]  # the job spec every trial overrides (its code shipped once)
    monitor: str
    mode: str  # min | max
    unit: str  # epochs | steps
    end: int
    storage_url: str
    state: str
    submitted_by: str = ""  # who the pool's server submitted the search for: its trials are theirs too

    @property
    def rungs(self) -> list[int]:
        return self.search.halving.rungs(self.end) if self.search.halving else [self.end]

    def trial_id(self, number: int) -> str:
        return trial_id(self.search_id, self.search.size, number)

    def pause_at(self, rung: int) -> Optional[int]:
        """Where a trial going into ``rung`` pauses (None: the last rung is the run's end)."""
        return self.rungs[rung] if rung < len(self.rungs) - 1 else None

    @classmethod
    def load(cls, client: redis.Redis, search_id: str) -> Optional["Plan"]:
        held = searches.meta(client, search_id)
        if "search" not in held:
            return None
        return cls(search_id, SearchSpec.model_validate_json(held["search"]), json.loads(held["spec"]), held["monitor"],
                   held["mode"], held["unit"], int(held["end"]), held["storage_url"], held["state"],
                   held.get("submitted_by", ""))


class TrialTaken(Exception):
    """A trial's id belongs to a job of someone else's (created after the search was submitted)."""


@dataclass(frozen=True)
class Trial:
    number: int
    status: JobStatus

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.status.overrides or {})


class Driver:
    def __init__(self, client: redis.Redis, search_id: str, publish: Publish, open_store: Callable[[str], ObjectStore]):
        self.redis, self.search_id, self.publish, self._open_store = client, search_id, publish, open_store
        self.records = JobRecords(client)
        self._store: Optional[ObjectStore] = None
        self._token: Optional[str] = None  # the lock this driver holds while it steps

    def _hold(self) -> None:
        """Keep the lock through a long step (each trial created or read renews it); LockLost if it lapsed
        and another decider may be stepping: this one stops, that one goes on."""
        if self._token is not None and not searches.relock(self.redis, self.search_id, self._token):
            raise searches.LockLost(f"search {self.search_id}: another decider took over")

    def advance(self) -> None:
        """Take the search's next steps if no one else is taking them (then that one sees this poke)."""
        searches.poke(self.redis, self.search_id)
        while True:
            token = self._token = searches.lock(self.redis, self.search_id)
            if token is None:
                return
            try:
                seen = searches.pokes(self.redis, self.search_id)
                self.step()
            except searches.LockLost:  # this step ran past the lock: whoever took it over goes on
                return
            finally:
                searches.unlock(self.redis, self.search_id, token)
                self._token = None
            if searches.pokes(self.redis, self.search_id) == seen:
                return

    def step(self) -> None:
        plan = Plan.load(self.redis, self.search_id)
        if plan is None or plan.state != "running":
            return
        trials = self.trials(plan)
        try:
            if plan.search.halving is not None and plan.search.halving.asynchronous:
                from baton.searches import asynchronous

                return asynchronous.step(self, plan, trials)
            sampled = self._sample(plan, trials)
        except TrialTaken as exc:
            searches.finish(self.redis, plan.search_id, None, f"{exc}: the search cannot go on")
            return
        if sampled:
            trials = self.trials(plan)
        population = sorted(trials)
        for rung in range(len(plan.rungs) - 1):
            if rung == 0 and len(trials) < plan.search.size:
                return
            decided = searches.decision(self.redis, plan.search_id, rung) or self._decide(plan, trials, population, rung)
            if decided is None:
                return
            self._promote(plan, trials, rung, decided)
            population = decided["promoted"]
        last = [trials[n] for n in population]
        if all(t.status.state.terminal for t in last):
            best = best_of(plan, last)
            searches.finish(self.redis, plan.search_id, best, None if best else
                            f"no trial of the last rung succeeded with a finite {plan.monitor}")

    def trials(self, plan: Plan) -> dict[int, Trial]:
        """The search's trials so far, by number (from 1)."""
        indexed: list = self.redis.zrange(keys.sweep(plan.search_id), 0, -1, withscores=True)  # type: ignore[assignment]
        return {int(score): Trial(int(score), self.records.status(text(job_id))) for job_id, score in indexed
                if 1 <= score <= plan.search.size and text(job_id) == plan.trial_id(int(score))}  # (nothing else)

    # --- rounds of trials ---------------------------------------------------------------------
    def _sample(self, plan: Plan, trials: dict[int, Trial]) -> bool:
        """Create the current round's missing trials (a decider that died mid-round left some), or the next
        round once every trial so far has reached the first rung; whether it created any. A round is sampled
        from the earlier rounds alone: the same trials whoever samples it, whenever."""
        size, per = plan.search.size, plan.search.round_size
        round_ = (max(trials) - 1) // per if trials else 0
        numbers = range(round_ * per + 1, min((round_ + 1) * per, size) + 1)
        if all(n in trials for n in numbers):
            if numbers.stop > size or not all(self.reached(plan, t, 0) for t in trials.values()):
                return False
            round_ += 1
            numbers = range(round_ * per + 1, min((round_ + 1) * per, size) + 1)
        history = [Told(trials[n].params, self.value(plan, trials[n], 0)) for n in range(1, numbers.start)]
        for number, params in zip(numbers, sample_round(plan.search, round_, history, plan.mode)):
            if number not in trials:
                self.create(plan, number, params)
        return True

    def create(self, plan: Plan, number: int, params: dict[str, Any]) -> None:
        """Trial ``number`` with ``params``, indexed and queued (a record a dead decider left of it: adopted)."""
        job_id = plan.trial_id(number)
        owner = self.redis.hget(keys.job(job_id), "sweep")  # (a decider that died may have created it)
        if owner is not None and text(owner) != plan.search_id or owner is None and self.records.exists(job_id):
            raise TrialTaken(f"trial {number}'s id {job_id!r} was taken by a job that is not this search's")
        created = owner is not None
        if not created:
            self._hold()
            extra = {"sweep": plan.search_id, "overrides": json.dumps(params, default=str),
                     **({"submitted_by": plan.submitted_by} if plan.submitted_by else {})}
            pause_at = plan.pause_at(0)
            if pause_at is not None:
                extra["pause_at"] = str(pause_at)
            created = self._create_job(plan, job_id, trial_spec(plan.base, params, job_id), extra)
            failpoints.pause("trial-created", job_id)  # a test's hold (failpoints.py); nothing otherwise
        self.redis.zadd(keys.sweep(plan.search_id), {job_id: number})
        if not searches.is_running(self.redis, plan.search_id):  # cancelled meanwhile (its scan may have missed this)
            self.records.cancel(job_id)
            raise searches.LockLost(f"search {plan.search_id} was cancelled")
        if created:
            self.publish(job_id, 1)

    def _create_job(self, plan: Plan, job_id: str, raw: dict, extra: dict[str, str]) -> bool:
        """The trial's job; a trial whose parameters make no valid spec is recorded failed, saying why
        (it ranks nowhere). Whether it was queued."""
        try:
            parsed = JobSpec.parse(raw)
        except SpecError as exc:
            given = raw.get("resources") if isinstance(raw, dict) else None
            resources = given if isinstance(given, dict) else {}
            self.records.restore(job_id, {**extra, "name": str(raw.get("name")), "error": "; ".join(exc.problems),
                                          "team": str(resources.get("team", "default"))}, JobState.failed, 0)  # (its team reads it)
            return False
        store = self.store(plan)
        try:
            create_job(self.records, store, job_id, parsed, extra)
        except SpecError:  # its spec was stored by a decider that died before the record: the trial is still ours
            if self.redis.exists(keys.job(job_id)):
                return False
            self.records.create(job_id, {**spec_fields(parsed, store.url), **extra})
        return True

    # --- rungs ----------------------------------------------------------------------------------
    def reached(self, plan: Plan, trial: Trial, rung: int) -> bool:
        """Whether the trial is paused at ``rung`` or has ended (nothing more will come of it)."""
        status = trial.status
        if status.state is JobState.paused:
            return status.pause_at == plan.pause_at(rung)
        return status.state.terminal

    def value(self, plan: Plan, trial: Trial, rung: int) -> Optional[float]:
        """The trial's monitored metric at the rung's validation (at the last rung: its best value); None
        for a trial that failed or was cancelled (wherever it was). Read once from its committed metrics."""
        if trial.status.state in (JobState.failed, JobState.cancelled):
            return None
        if rung == len(plan.rungs) - 1:
            return finite(trial.status.best_value) if trial.status.state is JobState.succeeded else None
        cached = searches.value(self.redis, plan.search_id, trial.number, rung)
        if cached is not None:
            return finite(float(cached))
        found = None
        if trial.status.state is JobState.paused or trial.status.state is JobState.succeeded:
            self._hold()
            store = self.store(plan)
            rows = read_metrics(store, ManifestStore(store, JobPaths(trial.status.id)).read())
            row = rung_row(rows, plan.unit, plan.rungs[rung])
            found = finite(row.get(plan.monitor)) if row is not None else None
        searches.keep_value(self.redis, plan.search_id, trial.number, rung, found)
        return found

    def _decide(self, plan: Plan, trials: dict[int, Trial], population: list[int], rung: int) -> Optional[dict]:
        if not all(self.reached(plan, trials[n], rung) for n in population):
            return None
        values = {n: self.value(plan, trials[n], rung) for n in population}
        sign = 1.0 if plan.mode == "min" else -1.0
        scored = {n: v for n, v in values.items() if v is not None}
        ranked = sorted(scored, key=lambda n: (sign * scored[n], n))
        keep = plan.search.halving.survivors(plan.search.size, rung + 1) if plan.search.halving else len(ranked)
        decided = searches.decide(self.redis, plan.search_id, rung, {
            "rung": plan.rungs[rung], "values": {str(n): values[n] for n in population}, "ranked": ranked,
            "promoted": ranked[:keep]})
        for place, number in enumerate(decided["ranked"], start=1):  # (baton status of a trial says so)
            if number not in decided["promoted"] and trials[number].status.state is JobState.paused:
                self.redis.hset(keys.job(trials[number].status.id), "last_event",
                                f"stopped by search {plan.search_id} at {plan.unit[:-1]} {plan.rungs[rung]} "
                                f"({plan.monitor} {place} of {len(decided['ranked'])})")
        return decided

    def _promote(self, plan: Plan, trials: dict[int, Trial], rung: int, decided: dict) -> None:
        """Continue each promoted trial still paused at ``rung`` (once: a continued one is not paused there)."""
        for place, number in enumerate(decided["promoted"], start=1):
            status = trials[number].status
            if status.state is not JobState.paused or status.pause_at != plan.pause_at(rung):
                continue
            why = (f"promoted by search {plan.search_id} at {plan.unit[:-1]} {plan.rungs[rung]} "
                   f"({plan.monitor} {place} of {len(decided['ranked'])})")
            attempt = continue_job(self.redis, status.id, plan.pause_at(rung + 1), why, plan.pause_at(rung))
            if attempt > 0:
                self.publish(status.id, attempt)

    def store(self, plan: Plan) -> ObjectStore:
        if self._store is None:
            self._store = self._open_store(plan.storage_url)
        return self._store


def searches_claiming(client: redis.Redis, job_ids: list[str]) -> dict[str, str]:
    """Of ``job_ids``, those that a running search will give to its trials: {job id: search id}."""
    plans: dict[str, Optional[Plan]] = {}
    claimed = {}
    for job_id in job_ids:
        search_id, _, number = job_id.rpartition("-")
        if not (search_id and number.isdigit()):
            continue
        if search_id not in plans:
            plans[search_id] = Plan.load(client, search_id)
        plan = plans[search_id]
        if (plan is not None and plan.state == "running" and 1 <= int(number) <= plan.search.size
                and plan.trial_id(int(number)) == job_id):
            claimed[job_id] = search_id
    return claimed


def own_trials(client: redis.Redis, search_id: str) -> list[str]:
    """The job ids of the search's trials whose records exist, indexed or not (a decider that died between a
    trial's record and its index left one unindexed)."""
    plan = Plan.load(client, search_id)
    if plan is None:
        return []
    ids = [plan.trial_id(n) for n in range(1, plan.search.size + 1)]
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(keys.job(job_id), "sweep")
    return [job_id for job_id, owner in zip(ids, pipe.execute()) if owner is not None and text(owner) == search_id]


def trial_id(search_id: str, size: int, number: int) -> str:
    """A trial's job id: the search's and its number, zero-padded to the search's size."""
    return f"{search_id}-{number:0{len(str(size))}d}"


def trial_spec(base: dict[str, Any], params: dict[str, Any], job_id: str) -> dict[str, Any]:
    """A trial's raw spec: the search's spec with its parameters, named for its number."""
    raw = apply_overrides(base, params)
    raw["name"] = f"{base.get('name')}-{job_id.rsplit('-', 1)[1]}"
    return raw


def rung_row(rows: list[dict], unit: str, at: int) -> Optional[dict]:
    """The metrics row of the validation a rung paused at: the end of epoch ``at`` (its last row), or the
    first validation at or past step ``at``."""
    if unit == "epochs":
        return next((row for row in reversed(rows) if row.get("epoch") == at), None)
    return next((row for row in rows if row.get("step", -1) >= at), None)


def best_of(plan: Plan, last: list[Trial]) -> Optional[str]:
    """The job id of the last rung's best trial by its best value (ties: the lower number)."""
    sign = 1.0 if plan.mode == "min" else -1.0
    scored = [(sign * v, t.number, t.status.id) for t in last if (v := finite(t.status.best_value)) is not None
              and t.status.state is JobState.succeeded]
    return min(scored)[2] if scored else None


def finite(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None

