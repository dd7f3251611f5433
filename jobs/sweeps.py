"""Sweeps: one spec, a grid of overrides, one job per grid point, compared by their best value.

A sweep is planned whole before anything is queued: every grid point is applied to the raw spec and
validated, so one bad value refuses the whole sweep. Its jobs share a sweep id (a field of each job
record, and the prefix of their ids) and their names carry the grid point's number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from baton.schemas.errors import SpecError
from baton.schemas.overrides import grid_points
from baton.schemas.spec import JobSpec
from baton.schemas.status import JobStatus
from baton.storage.layout import check_job_id

from baton.jobs.specfile import check_spec, with_overrides


@dataclass(frozen=True)
class PlannedJob:
    job_id: str
    overrides: dict[str, Any]  # the grid point and any --set, without the name suffix
    spec: JobSpec


MAX_POINTS = 1000
"""The most jobs one sweep queues (a search's trials have the same bound: ``baton.schemas.search.MAX_TRIALS``)."""


def plan(raw: Any, axes: dict[str, list[Any]], sweep_id: str, allowed_prefixes: tuple[str, ...],
         overrides: Optional[dict[str, Any]] = None) -> list[PlannedJob]:
    """Every grid point as a validated job; SpecError with every distinct problem if any is invalid, or when
    the grid has more than MAX_POINTS points (said before any is made)."""
    size = math.prod(len(values) for values in axes.values())
    if size > MAX_POINTS:
        raise SpecError([f"grid: {size:,} points ({' x '.join(str(len(v)) for v in axes.values())}); a sweep holds at "
                         f"most {MAX_POINTS:,}: split it, or sample it with a search (--search)"])
    points = grid_points(axes)
    width = len(str(len(points)))
    try:
        check_job_id(f"{sweep_id}-{len(points)}")
    except ValueError as exc:
        raise SpecError([f"sweep_id: {sweep_id!r} leaves no room for its jobs' numbers ({exc})"]) from None
    planned, problems = [], []
    for i, point in enumerate(points, start=1):
        number = f"{i:0{width}d}"
        wanted = {**(overrides or {}), **point}
        try:
            base = with_overrides(raw, wanted)
            name = f"{base.get('name')}-{number}" if isinstance(base.get("name"), str) else base.get("name")
            spec = check_spec({**base, "name": name}, allowed_prefixes)
        except SpecError as exc:
            problems += [p for p in exc.problems if p not in problems]
            continue
        planned.append(PlannedJob(f"{sweep_id}-{number}", wanted, spec))
    if problems:
        raise SpecError(problems)
    return planned


@dataclass(frozen=True)
class SweepEntry:
    """One job of a sweep, as ``baton list --sweep`` compares them."""

    status: JobStatus
    monitor: str
    mode: str  # min | max

    @property
    def best_value(self) -> Optional[float]:
        return self.status.best_value


def rank(entries: list[SweepEntry]) -> list[SweepEntry]:
    """Best first by each job's own monitor direction; jobs with no best value yet last, in grid order."""
    def key(entry: SweepEntry) -> tuple:
        value = entry.best_value
        if value is None or math.isnan(value):
            return (1, 0.0)
        return (0, value if entry.mode == "min" else -value)

    return sorted(entries, key=key)
