"""What runs a job: the training loop, its data-parallel ranks, tracking, one attempt, and the queue side.

Rooms, each importing only from the rooms below it (and from ``baton.schemas`` and ``baton.storage``)::

    queue/       the worker process: Celery app and task, claims, leases and fencing, reaper, preemption
    attempt/     one attempt at a job: resume, train, finalize; ``baton run`` in-process
    parallel/    data-parallel ranks on torch.distributed: launching, watching, the rank's main
    tracking/    what a run leaves for people: job logs, TensorBoard, MLflow, the report, curves, Prometheus
    training/    the loop and everything a step needs: components, data, tasks, AMP, RNG, train state

``queue`` -> ``attempt`` -> ``parallel``, ``tracking`` -> ``training``. The queue side reads and writes job
records through ``baton.storage.records`` (keys, records, leases, the Redis connection), as the user's side
(``baton.jobs``) does; neither side imports the other.
"""
