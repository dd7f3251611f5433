"""Data-parallel jobs on torch.distributed (``resources.processes: N``): the process group, rank 0's
launcher for ranks 1..N-1, and each rank's own main.

May import ``training`` (the same loop runs on every rank), ``baton.schemas`` and ``baton.storage``.
"""
