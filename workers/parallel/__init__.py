"""Data-parallel jobs on torch.distributed (``resources.processes: N``): the process group, rank 0's
launcher for ranks 1..N-1, and each rank's own main.

May import ``training`` (the same loop runs on every rank), ``baton.schemas``, ``baton.storage`` and
``baton.jobs.redaction`` (a rank redacts the failure it reports).
"""
