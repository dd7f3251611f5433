"""What a worker process sets up once: Redis, the reaper, signal handling, the start banner."""
from __future__ import annotations

import functools
import logging
import os
import platform
import time
from importlib import metadata
from typing import Optional

import redis
from celery import signals
from celery.worker import state as celery_state

from baton.storage.records import keys
from baton.storage.records.job_records import JobRecords
from baton.storage.redaction import RedactingFilter, Redactor
from baton.storage.records.connection import connect
from baton.schemas.settings import BatonSettings
from baton.storage.stores.open import open_store
from baton.storage.memory import memory_dirs
from baton.workers.attempt.process import ForkserverBroken, start_forkserver
from baton.workers.attempt.scratch import remove_orphaned_scratch
from baton.workers.tracking import prometheus
from baton.workers.parallel import gpu_probe

from baton.storage.records import presence
from baton.storage.records.messages import publish_join, publish_run
from baton.workers.queue.celery_app import app
from baton.workers.queue.worker_control import WorkerContext
from baton.workers.attempt.job_users import JobUserError, JobUsers
from baton.workers.queue.preemption import PREEMPTION
from baton.workers.queue.spot_notice import NoticePoller
from baton.workers.queue.redis_retry import TRANSIENT_REDIS_ERRORS
from baton.workers.queue.reaper import Reaper
from baton.workers.queue.worker_main import EXIT_REFUSED
from baton.workers.code import cache as shipped_code

_log = logging.getLogger("baton.worker")
_context: Optional[WorkerContext] = None


def worker_context(hostname: str) -> WorkerContext:
    global _context
    if _context is None:
        settings = BatonSettings()
        client = connect(settings)
        _context = WorkerContext(settings, client, JobRecords(client),
                                 lambda job_id, attempt, queue: publish_run(app, job_id, attempt, queue),
                                 PREEMPTION, hostname,
                                 publish_join=lambda job_id, attempt, nodes, queue: publish_join(
                                     app, job_id, attempt, nodes, queue))
    return _context


def device_banner() -> str:
    """Python's and torch's versions and the GPUs torch sees. This process imports torch only where a GPU
    driver may be present (``gpu_probe``): on a node without one the version is read from its metadata."""
    if not gpu_probe.may_have_gpus():
        return (f"python {platform.python_version()}, torch {metadata.version('torch')}; no GPU driver on this node "
                "(torch not asked): jobs with resources.device: cuda will fail here, auto runs on the CPU")
    import torch

    lines = [f"python {platform.python_version()}, torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            lines.append(f"GPU {i}: {torch.cuda.get_device_name(i)}")
    else:
        lines.append("no CUDA device visible: jobs with resources.device: cuda will fail here, auto runs on the CPU")
        if os.path.exists("/dev/nvidiactl") or gpu_probe.nvidia_promised():
            _log.error("this node has NVIDIA devices but torch sees no CUDA (%s, CUDA build %s): check the driver, the "
                       "container runtime and the image; jobs with device auto would silently train on the CPU",
                       torch.__version__, torch.version.cuda)
    return "; ".join(lines)


def _turn_made(counts: Optional[dict[str, tuple[int, int]]], yields: list) -> None:
    """The queues' sizes for Prometheus from the worker that made the scheduler's turn; cleared on the others."""
    if counts is None:
        prometheus.QUEUE_JOBS.clear()
        return
    for queue, (waiting, running) in counts.items():
        prometheus.QUEUE_JOBS.labels(queue, "waiting").set(waiting)
        prometheus.QUEUE_JOBS.labels(queue, "running").set(running)
    for decision in yields:
        prometheus.YIELDS.labels(decision.kind).inc()


def _count_reaped(job_id: str, action: str) -> None:
    if action == "requeue":
        prometheus.JOBS_RETRIED.labels("lost").inc()
    elif action == "outage":
        prometheus.JOBS_RETRIED.labels("redis").inc()


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _redact_logs(logger: logging.Logger, **_) -> None:
    """The worker's own log shows no secret of its environment (a job's error may quote one)."""
    redacting = RedactingFilter(Redactor())
    for handler in logger.handlers:
        handler.addFilter(redacting)


REDIS_WAIT_S = 0.5
"""How often start-up tries Redis again while it is away."""


def _when_redis_answers(call, what: str) -> None:
    """``call()``, tried again every REDIS_WAIT_S while Redis is unreachable (a restart, a failover)."""
    said = False
    while True:
        try:
            call()
            if said:
                _log.warning("Redis is back: %s done", what)
            return
        except TRANSIENT_REDIS_ERRORS as exc:
            if not said:
                _log.warning("Redis unavailable while %s (%s: %s); waiting for it", what, type(exc).__name__, exc)
                said = True
            time.sleep(REDIS_WAIT_S)


@signals.worker_ready.connect
def _on_ready(sender, **_) -> None:
    ctx = worker_context(sender.hostname)

    def mark_stopping() -> None:
        celery_state.should_stop = 0  # finish the current task, take no more
        ctx.redis.set(keys.worker_stopping(ctx.worker), "1", ex=int(ctx.settings.preempt_grace_s) + 60)

    _log.info("baton worker %s: connected to the broker; starting up", ctx.worker)
    try:
        ctx.users = JobUsers(ctx.settings.job_user, ctx.settings.job_uids)  # a slot's uid held from now on
        ctx.users.check_store(ctx.settings.storage_url)
    except JobUserError as exc:
        _log.critical("baton worker %s: refusing to start: %s", ctx.worker, exc)
        logging.shutdown()
        os._exit(EXIT_REFUSED)
    (_log.info if ctx.users.user is not None else _log.warning)("baton worker %s: %s", ctx.worker, ctx.users.describe())
    try:
        took = start_forkserver()  # the training processes' parent: its imports and warm-up, paid before any job
    except ForkserverBroken as exc:  # (this process imports no torch: a broken install shows here)
        _log.critical("baton worker %s: refusing to start: %s", ctx.worker, exc)
        logging.shutdown()
        os._exit(EXIT_REFUSED)
    _log.info("baton worker %s: training processes' forkserver ready in %.1fs", ctx.worker, took)
    # a worker killed outright on this machine (SIGKILL, OOM) left its checkpoint spool, event files and
    # in-memory copies
    remove_orphaned_scratch(open_store(ctx.settings.storage_url), _log.warning)
    for path in [*memory_dirs.remove_orphans(), *shipped_code.sweep_orphans()]:
        _log.warning("removed %s: left by a worker that is gone (killed outright)", path)
    # Redis may be away right now (the consumer connected a moment ago): wait for it, as every job
    # would; failing here left a worker taking jobs with no reaper, no preemption handler, no presence
    queues = sorted(sender.app.amqp.queues.consume_from or sender.app.amqp.queues)
    ctx.queues = tuple(queues)
    announce = functools.partial(presence.announce, ctx.redis, ctx.worker, queues, ctx.settings.reaper_period_s,
                                 ctx.offer, ctx.run)
    _when_redis_answers(lambda: ctx.redis.delete(keys.worker_stopping(ctx.worker)),  # a previous run's, by this name
                        "clearing this worker's stopping mark")
    PREEMPTION.install(ctx.settings.preempt_grace_s, on_request=mark_stopping)
    if ctx.settings.preemption_notice_url:
        NoticePoller(ctx.settings.preemption_notice_url,
                     lambda body: PREEMPTION.request(f"spot notice: {' '.join(body.split())[:120]}")).start()
    _when_redis_answers(announce, "announcing this worker's queues")
    Reaper(ctx.redis, ctx.publish, ctx.settings.reaper_period_s, ctx.worker, on_action=_count_reaped,
           lease_ttl_s=ctx.settings.lease_ttl_s, every_pass=announce, on_turn=_turn_made).start()

    def withdraw(**_) -> None:
        try:
            presence.withdraw(ctx.redis, ctx.worker, queues)
        except redis.RedisError as exc:  # its announcement lapses by itself
            _log.warning("could not withdraw this worker's queues (%s: %s)", type(exc).__name__, exc)

    signals.worker_shutdown.connect(withdraw, weak=False)
    signals.worker_shutdown.connect(lambda **_: ctx.code.close(), weak=False)  # its unpacked shipped code
    signals.worker_shutdown.connect(lambda **_: ctx.users.release(), weak=False)  # its last clear ended, its clearer
    prometheus.serve(ctx.settings.metrics_port)
    _log.warning("baton worker %s ready: %s", ctx.worker, device_banner())
