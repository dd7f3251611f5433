"""What a job needs of a worker, what a worker offers, and whether the offer is enough. Pure.

A worker says as it starts what never changes while it runs (``WorkerOffer``): whether it runs shipped
code (BATON_ACCEPT_CODE), the module prefixes it may import (BATON_ALLOWED_MODULES) and the GPUs it gives
a job's ranks. A job's record holds what it needs of those (``JobNeeds``, from its spec at submit). The
scheduler then knows, without asking any worker, that a job a worker cannot host must not free that
worker, and a waiting job's status says what no live worker of its queue offers. What a worker can only
find out by looking (a package installed, a store it can reach) it says when it meets the job
(``baton.storage.records.refusals``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from baton.schemas.spec import JobSpec
from baton.schemas.targets import module_allowed, parse_target


class WorkerOffer(BaseModel):
    """What a worker offers every job it takes, for as long as it runs (announced with its queues)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    accepts_code: bool = Field(False, description="It runs code shipped with a job (BATON_ACCEPT_CODE).")
    modules: tuple[str, ...] = Field((), description="The module prefixes it may import (BATON_ALLOWED_MODULES).")
    gpus: int = Field(0, description="The GPUs it gives a job's ranks (0: none; a job then trains on the CPU).")


class JobNeeds(BaseModel):
    """What a job needs of the worker that runs it (kept in its record: read without its spec)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ships_code: bool = False
    targets: tuple[tuple[str, str], ...] = Field((), description="(field, module) of each target not built in.")
    device: str = "auto"
    processes: int = 1

    @classmethod
    def of(cls, spec: JobSpec) -> "JobNeeds":
        targets = tuple((field, parse_target(text).module) for field, text in spec.user_targets().items()
                        if not parse_target(text).is_builtin)
        return cls(ships_code=spec.code is not None and spec.code.ships, targets=targets,
                   device=spec.resources.device, processes=spec.resources.processes)


class Lacking(NamedTuple):
    """Why a worker cannot host a job: ``why`` for the job's events (this worker), ``needs`` for its status
    when no live worker of the queue offers it ("no live worker of queue q " + needs)."""

    why: str
    needs: str


def devices_missing(requested: str, processes: int, have: int) -> Optional[str]:
    """Why a worker offering ``have`` GPUs cannot give a job of ``processes`` ranks on ``requested``
    (cpu, cuda, auto) one GPU per rank; None if it can. A worker with no GPU at all is not asked:
    ``auto`` trains on its CPU, ``cuda`` is refused by the training process's device check."""
    if processes <= 1 or requested == "cpu" or have == 0 or have >= processes:
        return None
    return (f"resources.processes: {processes} ranks need {processes} GPUs, one each; this worker offers {have} "
            f"(route the job to a queue served by workers started with --gpus-per-job {processes})")


def lacking(needs: JobNeeds, offer: WorkerOffer) -> Optional[Lacking]:
    """What ``offer`` lacks for a job of ``needs`` (GPUs for each rank, its modules, running the code it
    ships); None when it offers all of it (the worker may still find a package missing when it looks)."""
    missing = devices_missing(needs.device, needs.processes, offer.gpus)
    if missing is not None:
        return Lacking(missing, f"offers {needs.processes} GPUs, one for each of its ranks (--gpus-per-job)")
    for field, module in needs.targets:
        if not module_allowed(module, offer.modules):
            allowed = ",".join(offer.modules) or "(unset)"
            return Lacking(f"{field}: module {module!r} is not allowed here (BATON_ALLOWED_MODULES={allowed})",
                           f"may import module {module!r} (BATON_ALLOWED_MODULES)")
    if needs.ships_code and not offer.accepts_code:
        return Lacking("the job ships its own code, and this worker does not run shipped code (BATON_ACCEPT_CODE is off)",
                       "accepts shipped code (BATON_ACCEPT_CODE)")
    return None


@lru_cache(maxsize=4096)
def read_offer(raw: str) -> Optional[WorkerOffer]:
    """An offer as a worker announced it (JSON); None when it does not read as one. Workers of one pool
    mostly announce the same few offers: each is parsed once."""
    try:
        return WorkerOffer.model_validate_json(raw)
    except ValidationError:
        return None


@lru_cache(maxsize=4096)
def read_needs(raw: str) -> Optional[JobNeeds]:
    """A job's needs as its record holds them (JSON); None when absent or unreadable (a record written
    before records held them: any worker is assumed able, and says no when it meets the job)."""
    try:
        return JobNeeds.model_validate_json(raw) if raw else None
    except ValidationError:
        return None
