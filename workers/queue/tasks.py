"""The Celery tasks: thin doors into ``intake.run_job`` and ``intake.join_gang``. Loaded by workers only."""
from __future__ import annotations

from typing import Optional

from celery.exceptions import Reject

from baton.workers.queue.bootstrap import worker_context
from baton.storage.records.messages import JOIN_GANG_TASK, RUN_JOB_TASK
from baton.workers.queue.celery_app import app
from baton.workers.queue.intake import join_gang, run_job
from baton.workers.queue.preemption import PREEMPTION


@app.task(name=RUN_JOB_TASK, bind=True)
def run_job_task(self, job_id: str, attempt: int, queue: Optional[str] = None) -> str:
    if PREEMPTION.requested.is_set():
        # shutting down: a message taken now (perhaps the job this worker just released) goes back
        raise Reject("worker is shutting down", requeue=True)
    return run_job(worker_context(self.request.hostname), job_id, attempt, queue)


@app.task(name=JOIN_GANG_TASK, bind=True)
def join_gang_task(self, job_id: str, attempt: int, nodes: int) -> str:
    if PREEMPTION.requested.is_set():
        raise Reject("worker is shutting down", requeue=True)
    return join_gang(worker_context(self.request.hostname), job_id, attempt, nodes)
