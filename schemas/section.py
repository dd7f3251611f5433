"""What every section of the job spec shares: unknown keys refused, strict types, frozen values; and the
pattern of the names it holds (queues, teams)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class Section(BaseModel):
    # strict: "0.1" (a string) is not silently taken for a number
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
