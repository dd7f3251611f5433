"""What runs a job: the training loop, its data-parallel ranks, tracking, one attempt, and the queue side.

Rooms, each importing only from the rooms below it (and from ``baton.schemas`` and ``baton.storage``)::

    queue/       the worker process: Celery app and task, claims, leases and fencing, reaper, preemption
    attempt/     one attempt at a job: resume, train, finalize; ``baton run`` in-process
    parallel/    data-parallel ranks on torch.distributed: launching, watching, the rank's main
    tracking/    what a run leaves for people: job logs, TensorBoard, MLflow, the report, curves, Prometheus
    training/    the loop and everything a step needs: components, data, tasks, AMP, RNG, train state

``queue`` -> ``attempt`` -> ``parallel``, ``tracking`` -> ``training``. The queue side also reads and writes
job records through ``baton.jobs`` (keys, records, the Redis connection); nothing in ``baton.jobs``
imports the training loop except the CLI's ``run`` and ``worker`` commands, lazily.
"""
