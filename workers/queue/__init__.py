"""The worker process on the queue: the Celery app and its one task, a delivery's claim, lease,
heartbeat and fence, the reaper that re-queues jobs whose worker vanished, preemption (SIGTERM), the
stall watchdog, GPU assignment and start-up.

May import every other room of the workers, ``baton.schemas`` and ``baton.storage`` (its records in
Redis included). Importing ``celery_app`` alone does not import the training loop.
"""
