"""The Celery app: ``celery -A baton.workers.queue.celery_app worker`` works, and so does ``baton worker``.

Importing this module does not import the training loop (tasks are loaded by the worker at
start), so clients can publish with it.
"""
from __future__ import annotations

from celery import Celery

from baton.schemas.settings import BatonSettings

from baton.workers.queue.celery_config import celery_settings

RUN_JOB_TASK = "baton.run_job"
JOIN_GANG_TASK = "baton.join_gang"


def make_app(settings: BatonSettings) -> Celery:
    celery = Celery("baton", include=["baton.workers.queue.tasks", "baton.workers.queue.bootstrap"])
    celery.conf.update(celery_settings(settings))
    return celery


def publish_run(celery: Celery, job_id: str, attempt: int, queue: str) -> None:
    """Queue attempt ``attempt`` of ``job_id`` (JSON: two plain values)."""
    celery.send_task(RUN_JOB_TASK, args=[job_id, attempt], queue=queue)


def publish_join(celery: Celery, job_id: str, attempt: int, nodes: int, queue: str) -> None:
    """Ask a worker of ``queue`` to join the gang of attempt ``attempt`` of a job on ``nodes`` nodes."""
    celery.send_task(JOIN_GANG_TASK, args=[job_id, attempt, nodes], queue=queue)


app = make_app(BatonSettings())
