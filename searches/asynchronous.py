"""Asynchronous successive halving (ASHA, Li et al. 2020), for a search whose ``halving.asynchronous`` is set:
no rung waits for its slowest trial.

Whenever a trial pauses or ends, each free place (``concurrency`` trials train at once) goes first to a
paused trial that is among the best 1/factor of the trials that have reached its rung so far (the highest
rung first, then by its place), else to a new trial, sampled from every first-rung value known now. The
search ends once every trial exists and none trains or can go on; the paused ones stay stopped where
they are. Which trials go on depends on the order in which they arrived: the mode is timing-dependent,
by design (the synchronous default is not)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from baton.schemas.status import JobState
from baton.storage.records import keys, searches
from baton.storage.records.pausing import continue_job

from baton.searches.driver import Plan, Trial, best_of, finite
from baton.searches.sampling import Told, sample_one

if TYPE_CHECKING:
    from baton.searches.driver import Driver


def step(driver: "Driver", plan: Plan, trials: dict[int, Trial]) -> None:
    assert plan.search.halving is not None
    free = plan.search.round_size - sum(1 for t in trials.values() if _training(t))
    while free > 0 and (_promote(driver, plan, trials) or _start(driver, plan, trials)):
        free -= 1
        trials = driver.trials(plan)
    if len(trials) < plan.search.size or any(_training(t) for t in trials.values()):
        return
    if _promote(driver, plan, trials, settled=True):  # nothing more will arrive: each rung's best goes on
        return
    for number, trial in trials.items():  # (baton status of a trial says so)
        if trial.status.state is JobState.paused:
            driver.redis.hset(keys.job(trial.status.id), "last_event",
                              f"stopped by search {plan.search_id} at {plan.unit[:-1]} {trial.status.pause_at} "
                              f"(asynchronous: not among the best 1/{plan.search.halving.factor} at its rung)")
    sent = searches.finalists(driver.redis, plan.search_id)  # (not a trial resumed to its end by hand)
    best = best_of(plan, [t for n, t in trials.items() if n in sent])
    searches.finish(driver.redis, plan.search_id, best, None if best else
                    f"no trial reached the run's end with a finite {plan.monitor}")


def _training(trial: Trial) -> bool:
    return not (trial.status.state is JobState.paused or trial.status.state.terminal)


def _promote(driver: "Driver", plan: Plan, trials: dict[int, Trial], settled: bool = False) -> bool:
    """Continue the best promotable trial to its next rung; whether there was one (its place is taken)."""
    found = _promotable(driver, plan, trials, settled)
    if found is None:
        return False
    trial, rung, place, count = found
    if rung + 1 == len(plan.rungs) - 1:
        searches.promote_to_end(driver.redis, plan.search_id, trial.number)
    why = (f"promoted by search {plan.search_id} at {plan.unit[:-1]} {plan.rungs[rung]} "
           f"({plan.monitor} {place} of {count} so far)")
    attempt = continue_job(driver.redis, trial.status.id, plan.pause_at(rung + 1), why, plan.pause_at(rung))
    if attempt > 0:
        driver.publish(trial.status.id, attempt)
    return True


def _promotable(driver: "Driver", plan: Plan, trials: dict[int, Trial],
                settled: bool = False) -> Optional[tuple[Trial, int, int, int]]:
    """(trial, its rung, its place there, how many are there) of the first paused trial among the best
    1/factor of its rung so far, the highest rung first; None when there is none. ``settled`` (every trial
    exists and none trains): at least one of each rung, as the synchronous mode keeps, so that a few trials
    still reach the end."""
    assert plan.search.halving is not None
    sign = 1.0 if plan.mode == "min" else -1.0
    for rung in reversed(range(len(plan.rungs) - 1)):
        scored = {n: v for n, t in trials.items() if (v := value_at(driver, plan, t, rung)) is not None}
        ranked = sorted(scored, key=lambda n: (sign * scored[n], n))
        keep = len(ranked) // plan.search.halving.factor
        for place, number in enumerate(ranked[:max(1, keep) if settled else keep], start=1):
            status = trials[number].status
            if status.state is JobState.paused and status.pause_at == plan.pause_at(rung):
                return trials[number], rung, place, len(ranked)
    return None


def value_at(driver: "Driver", plan: Plan, trial: Trial, rung: int) -> Optional[float]:
    """The trial's metric at ``rung`` if it has got there (paused there or beyond, ended, or promoted from
    there: its value was read when it paused); None otherwise. Never read before the trial got there."""
    status = trial.status
    reached = status.state is JobState.succeeded or (
        status.state is JobState.paused and status.pause_at in plan.rungs and plan.rungs.index(status.pause_at) >= rung)
    if reached:
        return driver.value(plan, trial, rung)
    cached = searches.value(driver.redis, plan.search_id, trial.number, rung)
    return finite(cached) if cached is not None else None


def _start(driver: "Driver", plan: Plan, trials: dict[int, Trial]) -> bool:
    """Create the next trial, sampled from the first-rung values known now; False once all exist."""
    number = max(trials, default=0) + 1
    if number > plan.search.size:
        return False
    known = {n: value_at(driver, plan, t, 0) for n, t in sorted(trials.items())}
    history = [Told(trials[n].params, value) for n, value in known.items()
               if value is not None or trials[n].status.state in (JobState.failed, JobState.cancelled)]
    driver.create(plan, number, sample_one(plan.search, number, history, plan.mode))
    return True
