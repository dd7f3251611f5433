"""Which parameters each trial of a search trains with: Optuna's samplers (random, TPE), a seeded grid.

Trials are sampled in rounds (``SearchSpec.round_size``). Round ``r`` is sampled by a fresh in-memory
Optuna study seeded by the search's seed and ``r``, told the earlier rounds' values at the first rung in
trial order: the same search file, seed and values give the same trials, however many workers ran them
and whatever preempted them on the way.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional

from baton.schemas.overrides import grid_points
from baton.schemas.search import Dimension, SearchSpec


@dataclass(frozen=True)
class Told:
    """An earlier trial: its parameters and its value at the first rung (None: it failed there)."""

    params: dict[str, Any]
    value: Optional[float]


def sample_round(search: SearchSpec, round_: int, history: list[Told], mode: str) -> list[dict[str, Any]]:
    """The parameters of round ``round_``'s trials (``mode``: the monitored metric's min or max)."""
    first = round_ * search.round_size
    count = min(search.round_size, search.size - first)
    if count <= 0:
        return []
    if search.sampler == "grid":
        return grid(search)[first:first + count]
    return _optuna_round(search, round_, history, mode, count)


def sample_one(search: SearchSpec, number: int, history: list[Told], mode: str) -> dict[str, Any]:
    """Trial ``number``'s parameters (from 1) for an asynchronous search: told every earlier trial's value at
    the first rung known now (timing-dependent, as the mode is); a grid's point ``number`` as ever."""
    if search.sampler == "grid":
        return grid(search)[number - 1]
    return _optuna_round(search, 1_000_000 + number, history, mode, 1)[0]  # (a seed no round of the other mode has)


def known_trials(search: SearchSpec, mode: str) -> list[dict[str, Any]]:
    """The trials known before any has trained: a grid's and random sampling's all (neither learns), TPE's
    first round. Needs Optuna for random and TPE sampling (ImportError without it)."""
    if search.halving is not None and search.halving.asynchronous:
        first = search.round_size if search.sampler == "tpe" else search.size  # (the first to start learn nothing)
        return [sample_one(search, number, [], mode) for number in range(1, first + 1)]
    if search.sampler == "tpe":
        return sample_round(search, 0, [], mode)
    rounds = -(-search.size // search.round_size)
    return [params for r in range(rounds) for params in sample_round(search, r, [], mode)]


def grid(search: SearchSpec) -> list[dict[str, Any]]:
    """Every grid point in the file's order; ``trials`` fewer than the grid: that many, drawn by the seed."""
    points = grid_points({path: d.values() or [] for path, d in search.space.items()})
    if search.size < len(points):
        chosen = sorted(random.Random(search.seed).sample(range(len(points)), search.size))
        points = [points[i] for i in chosen]
    return points


def _optuna_round(search: SearchSpec, round_: int, history: list[Told], mode: str, count: int) -> list[dict[str, Any]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed = (search.seed * 100_003 + round_) % 2**32  # one seed per round: a round never depends on how many asked
    sampler = (optuna.samplers.TPESampler(seed=seed) if search.sampler == "tpe"
               else optuna.samplers.RandomSampler(seed=seed))
    study = optuna.create_study(direction="minimize" if mode == "min" else "maximize", sampler=sampler)
    distributions = {path: _distribution(d) for path, d in search.space.items()}
    for told in history:
        state = optuna.trial.TrialState.COMPLETE if told.value is not None else optuna.trial.TrialState.FAIL
        study.add_trial(optuna.trial.create_trial(params=_encode(search, told.params), distributions=distributions,
                                                  value=told.value, state=state))
    return [_decode(search, study.ask(distributions).params) for _ in range(count)]


def _distribution(d: Dimension):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if d.choice is not None:  # by index: a choice may be any YAML value (a list, a mapping)
        return CategoricalDistribution(list(range(len(d.choice))))
    if d.integer is not None:
        return IntDistribution(d.integer[0], d.integer[1])
    low, high = d.bounds or (0.0, 1.0)
    return FloatDistribution(low, high, log=d.loguniform is not None)


def _encode(search: SearchSpec, params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as Optuna holds them (a choice by its index)."""
    encoded = {}
    for path, d in search.space.items():
        value = params[path]
        encoded[path] = d.choice.index(value) if d.choice is not None else value
    return encoded


def _decode(search: SearchSpec, params: dict[str, Any]) -> dict[str, Any]:
    decoded = {}
    for path, d in search.space.items():
        value = params[path]
        decoded[path] = d.choice[value] if d.choice is not None else value
    return decoded
