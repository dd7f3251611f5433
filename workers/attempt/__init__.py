"""One attempt at a job, whoever runs it: resume from the newest checkpoint that verifies, train
(one process or a data-parallel group), finalize (weights, report, curves, ``completed``).
``local`` is ``baton run``: an attempt in this process, with no Redis.

May import ``training``, ``parallel``, ``tracking``, ``baton.schemas`` and ``baton.storage``; never the
queue side.
"""
