"""What a user touches: the JobClient and its jobs, spec files, sweeps, how jobs look in a terminal,
reading a job's log, recovering records from the store, and the demo's services. Imports
``baton.schemas`` and ``baton.storage`` only (the command line, ``baton.cli``, sees both sides)."""
from baton.jobs.client import Job, JobClient

__all__ = ["Job", "JobClient"]
