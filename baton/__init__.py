"""baton: preemption-proof PyTorch training jobs.

The public surface::

    from baton import JobClient, JobSpec

    client = JobClient()                 # BATON_REDIS_URL, BATON_STORAGE_URL from the environment
    job = client.submit("job.yaml")      # or a JobSpec, or a dict
    job.wait(); job.download("out/", which="best")

baton's own packages live under this one namespace (``baton.schemas``, ``baton.storage``,
``baton.workers``, ``baton.jobs``), so a user's package named ``jobs`` or ``workers`` stays the user's.
"""
from baton.jobs.client import Job, JobClient
from baton.schemas.spec import JobSpec

__all__ = ["Job", "JobClient", "JobSpec"]
