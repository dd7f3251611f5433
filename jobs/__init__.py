"""What a user touches: the JobClient, job records, the CLI."""
from baton.jobs.client import Job, JobClient

__all__ = ["Job", "JobClient"]
