"""baton: preemption-proof PyTorch training jobs.

The public surface::

    from baton import JobClient, JobSpec

    client = JobClient()                 # BATON_REDIS_URL, BATON_STORAGE_URL from the environment
    job = client.submit("job.yaml")      # or a JobSpec, or a dict
    job.wait(); job.download("out/", which="best")

and, for your own tasks, ``from baton import Task, TaskError`` (the protocol a task follows).

baton's own packages live under this one namespace (``baton.schemas``, ``baton.storage``,
``baton.workers``, ``baton.jobs``), so a user's package named ``jobs`` or ``workers`` stays the user's.
Names are imported when first used: ``import baton.schemas`` does not load the client or torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.jobs.client import Job, JobClient
    from baton.schemas.spec import JobSpec
    from baton.workers.training.task_api import Task, TaskError

_PUBLIC = {
    "Job": "baton.jobs.client",
    "JobClient": "baton.jobs.client",
    "JobSpec": "baton.schemas.spec",
    "Task": "baton.workers.training.task_api",
    "TaskError": "baton.workers.training.task_api",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'baton' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
