"""baton's Celery settings, each with the reason it is set (celery/app/defaults.py names them).

Celery only delivers messages here; job state, leases and retries are baton's own (see
storage/records/job_records.py, storage/records/leases.py, storage/records/reaping.py), because with a Redis broker Celery's
redelivery is slow after a SIGKILL (visibility_timeout) and can run a long task twice.
"""
from __future__ import annotations

from baton.storage.records.connection import ssl_options
from baton.schemas.settings import BatonSettings

VISIBILITY_TIMEOUT_S = 6 * 3600
"""kombu redelivers an unacked message after this. baton does not rely on it (a lost job comes back
through its lease within seconds); it only bounds how long a message can sit unacked. Duplicates it
causes are dropped by the claim."""


def celery_settings(settings: BatonSettings) -> dict:
    ssl = ssl_options(settings.redis_url, settings.redis_ca_certs)
    return {
        "broker_url": settings.redis_url,
        # rediss:// must verify the server's certificate; kombu does not unless told to
        "broker_use_ssl": ssl or None,
        # baton keeps job state in its own records; Celery results would be a second, unfenced copy
        "result_backend": None,
        "task_ignore_result": True,
        # JSON only: a message is a job id and an attempt number, never a pickle
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        # ack after the task returns: a worker that dies before claiming leaves the message to be redelivered
        "task_acks_late": True,
        # a pool child killed mid-task requeues its message (the claim then drops it if stale)
        "task_reject_on_worker_lost": True,
        # one message at a time per process: a training job is hours long, nothing to prefetch
        "worker_prefetch_multiplier": 1,
        # one job per process, in the worker's main process: SIGTERM reaches the training loop there
        # (a prefork child never sees worker_shutting_down), and DataLoader workers may fork freely
        "worker_pool": "solo",
        "worker_concurrency": 1,
        "task_default_queue": "default",
        "task_create_missing_queues": True,
        "broker_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT_S},
        "broker_connection_retry_on_startup": True,
        # Flower and `celery events` see baton's tasks
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        # baton's own logging and signal handling stay in charge of the process
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
    }
