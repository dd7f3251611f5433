"""One line of the pool's audit trail: who asked for what, on what, from where, and what came of it.
No I/O (``baton.storage.records.audit`` keeps them)."""
from __future__ import annotations

import time
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class AuditEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float = Field(description="Unix time of the request.")
    principal: Optional[str] = Field(description="Who asked; None when no token proved anyone.")
    action: str = Field(description="What was asked: submit, cancel, quota, users.add, ...")
    target: str = Field("", description="What it was asked of: a job's id, a team, a user, a worker.")
    result: Literal["allowed", "refused", "failed"]
    reason: str = Field("", description="Why it was refused or failed, in one line.")
    client: str = Field("", description="The client's address, as the server saw it.")

    def line(self) -> str:
        """The entry as ``baton audit`` prints it."""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.at))
        said = f" ({self.reason})" if self.reason else ""
        line = (f"{when}Z {self.principal or '-'} {self.action} {self.target or '-'} {self.result}{said}"
                f" from {self.client or '-'}")
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)  # (a target of a\nb: one line)
