"""A search file (``baton sweep SPEC --search FILE``): which spec fields to search, how to sample them,
how many trials, and when to stop the losers (successive halving).

    space:
      optimizer.lr: {loguniform: [1.0e-4, 1.0e-1]}
      optimizer.weight_decay: {uniform: [0.0, 0.1]}
      model.kwargs.hidden: {choice: [16, 32, 64]}
      data.batch_size: {int: [16, 64]}
    sampler: tpe          # random (default) | grid | tpe
    seed: 0
    trials: 27
    concurrency: 9        # trials sampled (and running) at once; default: all
    halving: {min_resource: 2, factor: 3}     # asynchronous: true for ASHA (timing-dependent)

Pure: no I/O. Rungs are in the spec's own unit: epochs for a run of ``loop.epochs``, steps for one of
``loop.max_steps``; the last rung is the run's end.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from baton.schemas.errors import SpecError
from baton.schemas.problems import problems_from

MAX_TRIALS = 1000
KINDS = ("choice", "uniform", "loguniform", "int")
FIELDS = {"choice": "choice", "uniform": "uniform", "loguniform": "loguniform", "int": "integer"}


class Dimension(BaseModel):
    """One searched field: exactly one of ``choice``, ``uniform``, ``loguniform``, ``int`` (bounds inclusive)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    choice: Optional[list[Any]] = Field(None, min_length=1)
    uniform: Optional[tuple[float, float]] = None
    loguniform: Optional[tuple[float, float]] = None
    integer: Optional[tuple[int, int]] = Field(None, alias="int")

    @model_validator(mode="after")
    def _one_kind(self) -> "Dimension":
        given = [k for k in KINDS if getattr(self, FIELDS[k]) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of choice, uniform, loguniform, int (got {', '.join(given) or 'none'})")
        low, high = self.bounds or (0, 1)
        if low > high:
            raise ValueError(f"{given[0]}: the low bound {low} is above the high bound {high}")
        if self.loguniform is not None and low <= 0:
            raise ValueError(f"loguniform: bounds must be above 0 (got {low})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, FIELDS[k]) is not None)

    @property
    def bounds(self) -> Optional[tuple[float, float]]:
        return self.uniform or self.loguniform or self.integer

    def values(self) -> Optional[list[Any]]:
        """Every value a grid takes (None for a continuous range)."""
        if self.choice is not None:
            return list(self.choice)
        if self.integer is not None:
            return list(range(self.integer[0], self.integer[1] + 1))
        return None


class Halving(BaseModel):
    """Successive halving: every trial trains to ``min_resource``; at each rung the best 1/``factor`` go on
    to the next (``min_resource`` x ``factor``, x ``factor``^2, ...) and the rest stop there, paused."""

    model_config = ConfigDict(extra="forbid")

    min_resource: int = Field(..., ge=1, description="The first rung: epochs (or steps, for a run of loop.max_steps).")
    factor: int = Field(3, ge=2, description="At each rung, one trial in `factor` goes on.")
    asynchronous: bool = Field(False, description="ASHA: a trial goes on as soon as it is among the best 1/factor "
                               "of the trials at its rung so far, and a new trial starts whenever one stops; "
                               "no rung waits for its slowest trial, and which trials go on depends on timing.")

    def rungs(self, end: int) -> list[int]:
        """The rungs before the run's ``end`` (epochs or steps), then ``end``."""
        rungs, at = [], self.min_resource
        while at < end:
            rungs.append(at)
            at *= self.factor
        return rungs + [end]

    def survivors(self, n: int, rung: int) -> int:
        """How many of ``n`` trials reach rung ``rung`` (0: all)."""
        for _ in range(rung):
            n = max(1, n // self.factor)
        return n


class SearchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    space: dict[str, Dimension] = Field(..., min_length=1, description="Dotted spec paths and their ranges.")
    sampler: Literal["random", "grid", "tpe"] = "random"
    seed: int = Field(0, ge=0, le=2**32 - 1, description="The sampler's seed (0 to 2**32 - 1).")
    trials: Optional[int] = Field(None, ge=1, le=MAX_TRIALS, description="Trials in all (default: a grid's size).")
    concurrency: Optional[int] = Field(None, ge=1, description="Trials sampled and queued at once (default: all).")
    halving: Optional[Halving] = None

    @model_validator(mode="after")
    def _sized(self) -> "SearchSpec":
        if self.sampler == "grid":
            continuous = [path for path, d in self.space.items() if d.values() is None]
            if continuous:
                verb = "is" if len(continuous) == 1 else "are"
                raise ValueError(f"a grid takes choice and int ranges only ({', '.join(continuous)} {verb} continuous)")
            size = self.grid_size
            if self.trials is not None and self.trials > size:
                raise ValueError(f"trials: {self.trials} is more than the grid's {size} points")
        elif self.trials is None:
            raise ValueError(f"trials: how many to sample (the {self.sampler} sampler has no size of its own)")
        if self.size > MAX_TRIALS:
            raise ValueError(f"trials: {self.size} is more than {MAX_TRIALS}")
        return self

    @property
    def grid_size(self) -> int:
        return math.prod(len(d.values() or ()) for d in self.space.values())

    @property
    def size(self) -> int:
        """Trials in all."""
        return self.trials if self.trials is not None else self.grid_size

    @property
    def round_size(self) -> int:
        """Trials sampled together (a tpe sampler learns from each round's first rung before the next)."""
        return min(self.concurrency or self.size, self.size)

    @classmethod
    def parse(cls, raw: Any) -> "SearchSpec":
        """SpecError naming every wrong field (``search.space.optimizer.lr: ...``)."""
        if not isinstance(raw, dict):
            raise SpecError([f"search: must be a mapping (got {type(raw).__name__})"], "search")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise SpecError(problems_from(exc, "search", cls), "search") from None
