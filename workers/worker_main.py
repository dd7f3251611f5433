"""``baton worker``: a Celery worker with baton's settings, one job per process.

Before anything else it probes its store (BATON_STORAGE_URL): a store that ignores conditional
writes would turn every fenced commit into a blind overwrite, so the worker refuses to start
(exit 2, naming the store).

With ``--concurrency N`` or ``--gpus`` it supervises one such worker process per slot (each
named ``NAME-i``, each pinned to its own GPU with ``--gpus``), passes SIGTERM/SIGINT on to all
of them and exits when they have.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Optional, Sequence


def default_name() -> str:
    return f"baton-{os.getpid()}@{socket.gethostname()}"


def celery_argv(name: str, queues: str, loglevel: str) -> list[str]:
    return ["worker", "--hostname", name, "--queues", queues, "--pool", "solo", "--concurrency", "1",
            "--task-events", "--without-gossip", "--without-mingle", "--loglevel", loglevel]


def run_one(name: str, queues: str, loglevel: str) -> None:
    """This process becomes one Celery worker (returns when it shuts down)."""
    from .celery_app import app

    app.worker_main(celery_argv(name, queues, loglevel))


def child_name(name: str, index: int) -> str:
    local, at, host = name.partition("@")
    return f"{local}-{index}{at}{host}"


def supervise(name: str, queues: str, loglevel: str, children_env: Sequence[dict[str, str]]) -> int:
    """Start one worker process per entry of ``children_env`` (extra environment for each)."""
    procs = []
    for index, extra in enumerate(children_env):
        argv = [sys.executable, "-m", "jobs", "worker", "--name", child_name(name, index), "--queues", queues,
                "--loglevel", loglevel]
        procs.append(subprocess.Popen(argv, env={**os.environ, **extra}))

    def forward(signum: int, frame) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [proc.wait() for proc in procs]
    return max(codes, default=0)


def check_storage(storage_url: str) -> Optional[str]:
    """None when the store can hold jobs; else why not (it ignores conditional writes, or cannot
    be reached or used at all). A worker that cannot commit safely must not take jobs."""
    from schemas.errors import BatonError
    from storage.conditional_probe import check_conditional_writes
    from storage.open import open_store

    try:
        check_conditional_writes(open_store(storage_url))
    except BatonError as exc:
        return f"baton worker: refusing to start: {exc}"
    return None


def run_worker(name: Optional[str], queues: str, concurrency: int, loglevel: str, gpus: Optional[str] = None,
               gpus_per_job: int = 1) -> int:
    from schemas.settings import BatonSettings

    from .gpus import plan

    refusal = check_storage(BatonSettings().storage_url)
    if refusal is not None:
        print(refusal, file=sys.stderr, flush=True)
        return 2
    name = name or default_name()
    device_count = 0
    if gpus is not None:
        import torch

        device_count = torch.cuda.device_count()
    children = plan(gpus, concurrency, dict(os.environ), device_count, BatonSettings().metrics_port, gpus_per_job)
    if len(children) == 1 and gpus is None:
        run_one(name, queues, loglevel)
        return 0
    return supervise(name, queues, loglevel, children)
