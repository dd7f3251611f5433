"""The messages that deliver attempts to workers, as they travel through Celery on Redis: the task
names, their JSON arguments (plain values: a job id, an attempt number, a node count), and the Celery
app that publishes them. Workers consume them with the same app and tasks of their own
(``baton.workers.queue.celery_app``)."""
from __future__ import annotations

from typing import Sequence

from celery import Celery

from baton.schemas.settings import BatonSettings

from baton.storage.records.celery_config import celery_settings

RUN_JOB_TASK = "baton.run_job"
JOIN_GANG_TASK = "baton.join_gang"


def make_app(settings: BatonSettings, include: Sequence[str] = ()) -> Celery:
    """The Celery app on ``settings``' Redis; ``include``: the modules a worker loads its tasks from."""
    celery = Celery("baton", include=list(include))
    celery.conf.update(celery_settings(settings))
    return celery


def publish_run(celery: Celery, job_id: str, attempt: int, queue: str) -> None:
    """Wake a worker of ``queue`` for attempt ``attempt`` of ``job_id``: the worker that takes it starts the
    first waiting job of the queue's start order that it can host (``baton.storage.records.pool``), which is
    this one unless another comes first. Every waiting job has one such message out (or more: duplicates
    find nothing waiting and are dropped)."""
    celery.send_task(RUN_JOB_TASK, args=[job_id, attempt], kwargs={"queue": queue}, queue=queue)


def publish_join(celery: Celery, job_id: str, attempt: int, nodes: int, queue: str) -> None:
    """Ask a worker of ``queue`` to join the gang of attempt ``attempt`` of a job on ``nodes`` nodes."""
    celery.send_task(JOIN_GANG_TASK, args=[job_id, attempt, nodes], queue=queue)

