"""The workers' Celery app: ``celery -A baton.workers.queue.celery_app worker`` works, and so does ``baton worker``.

Importing this module does not import the training loop (tasks are loaded by the worker at start).
Clients publish with ``baton.storage.records.messages`` instead.
"""
from __future__ import annotations

from baton.schemas.settings import BatonSettings
from baton.storage.records.messages import make_app

TASK_MODULES = ("baton.workers.queue.tasks", "baton.workers.queue.bootstrap")

app = make_app(BatonSettings(), include=TASK_MODULES)
