"""Who acts on the pool: a principal (a person or a service) with a role and the teams it belongs to.

No I/O: the records live in Redis (``baton.storage.records.principals``), what each role may do is
``baton.jobs.roles``.
"""
from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from baton.schemas.section import NAME_PATTERN

PRINCIPAL_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
"""A principal's name: lower case, as it appears in audit lines and ``submitted_by``."""

TeamName = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]


class Role(str, enum.Enum):
    member = "member"  # submits to its teams; acts on its own jobs; reads its teams'
    lead = "lead"  # acts on every job of its teams
    admin = "admin"  # quotas, team limits, drain, users; every job


class Principal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=PRINCIPAL_PATTERN)
    role: Role
    teams: tuple[TeamName, ...] = Field(default=(), description="The teams it submits to and reads; an admin may have none.")
    service: bool = Field(False, description="A service account (a CI pipeline, a scheduler), not a person.")
    created_at: float = 0.0

    def in_team(self, team: str) -> bool:
        return team in self.teams
