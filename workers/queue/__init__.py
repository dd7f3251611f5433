"""The worker process on the queue: the Celery app and its one task, a delivery's claim, lease,
heartbeat and fence, the reaper that re-queues jobs whose worker vanished, preemption (SIGTERM), the
stall watchdog, GPU assignment and start-up.

May import every other room, ``baton.schemas``, ``baton.storage`` and ``baton.jobs``' records.
Importing ``celery_app`` alone does not import the training loop: clients publish with it.
"""
