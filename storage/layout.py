"""Every object path baton writes, built in one place (DESIGN "Storage layout")."""
from __future__ import annotations

import re
from dataclasses import dataclass

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_JOB_ID_RE = re.compile(JOB_ID_PATTERN)


def check_job_id(job_id: str) -> str:
    if not _JOB_ID_RE.match(job_id):
        raise ValueError(f"job id must match {JOB_ID_PATTERN} (got {job_id!r})")
    return job_id


def new_job_id(name: str) -> str:
    """``<name>-<UTC time>-<4 hex>``: readable, sortable, unlikely to collide."""
    import secrets
    from datetime import datetime, timezone

    return check_job_id(f"{name}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}")


@dataclass(frozen=True)
class JobPaths:
    job_id: str

    def __post_init__(self) -> None:
        check_job_id(self.job_id)

    @property
    def root(self) -> str:
        return f"jobs/{self.job_id}"

    @property
    def spec(self) -> str:
        return f"{self.root}/spec.json"

    @property
    def manifest(self) -> str:
        return f"{self.root}/manifest.json"

    @property
    def metrics(self) -> str:
        return f"{self.root}/metrics.jsonl"

    @property
    def checkpoints(self) -> str:
        return f"{self.root}/checkpoints/"

    def checkpoint(self, step: int) -> str:
        return f"{self.checkpoints}step-{step}.pt"

    @property
    def best(self) -> str:
        return f"{self.checkpoints}best.pt"

    @property
    def final_model(self) -> str:
        return f"{self.root}/final/model.safetensors"

    @property
    def report(self) -> str:
        return f"{self.root}/report.json"

    @property
    def curves(self) -> str:
        return f"{self.root}/curves.png"
