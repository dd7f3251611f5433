"""``baton worker``: a Celery worker with baton's settings, one job per process.

Before anything else it probes its store (BATON_STORAGE_URL): a store that ignores conditional
writes would turn every fenced commit into a blind overwrite, so the worker refuses to start
(exit 2, naming the store).

With ``--concurrency N`` or ``--gpus`` it supervises one such worker process per slot (each
named ``NAME-i``, each pinned to its own GPU with ``--gpus``), passes SIGTERM/SIGINT on to all
of them and exits when they have. A child that exits with the stall watchdog's status (70: it
abandoned a hung job, ``stall.py``) is started again in its slot, at most ``RESTARTS_MAX`` times
in ``RESTART_WINDOW_S`` per slot (a node where every job hangs must not spin); any other exit
leaves its slot empty, as before, and the supervisor's status is the highest of its children's.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import Callable, Optional, Sequence

RESTART_EXIT_CODES = frozenset({70})
"""Child exits that mean "start me again": the stall watchdog's (``stall.EXIT_STALLED``, not imported
here so the supervisor does not load the worker's modules)."""
RESTARTS_MAX = 5
"""Restarts of one slot allowed within ``RESTART_WINDOW_S``; past that its exit stands."""
RESTART_WINDOW_S = 600.0
POLL_S = 0.2
"""How often the supervisor looks at its children."""


def node_name(name: Optional[str]) -> str:
    """The worker's name as Celery, baton status and the job records show it: ``NAME@HOST``. A name
    given without a host gets this machine's (Celery would read a bare ``w1`` as the host, giving
    ``celery@w1``); none at all is ``baton-PID@HOST``."""
    if not name:
        return f"baton-{os.getpid()}@{socket.gethostname()}"
    return name if "@" in name else f"{name}@{socket.gethostname()}"


def celery_argv(name: str, queues: str, loglevel: str) -> list[str]:
    return ["worker", "--hostname", name, "--queues", queues, "--pool", "solo", "--concurrency", "1",
            "--task-events", "--without-gossip", "--without-mingle", "--loglevel", loglevel]


def run_one(name: str, queues: str, loglevel: str) -> None:
    """This process becomes one Celery worker (returns when it shuts down)."""
    from baton.workers.attempt.process import warm_forkserver_early
    from baton.workers.queue.celery_app import app

    warm_forkserver_early()  # its imports overlap Celery's start-up; the worker is ready when both are
    _quiet_celerys_root_warning()
    app.worker_main(celery_argv(name, queues, loglevel))


ROOT_WARNING = "You're running the worker with superuser privileges"
"""The start of Celery's warning to a worker that runs as root."""


def _quiet_celerys_root_warning() -> None:
    """Celery warns a worker that runs as root that it should not (it would run its tasks as root). A baton
    worker that may change user runs as root to run each job as a user of its own (``job_users``), never a
    job's code as root: the warning is dropped there, and kept where jobs run as the worker
    (``BATON_JOB_USER=worker``)."""
    import warnings

    from baton.schemas.settings import BatonSettings
    from baton.workers.attempt.job_users import WORKER, may_change_user

    if may_change_user() and BatonSettings().job_user.strip() != WORKER:
        warnings.filterwarnings("ignore", message=ROOT_WARNING)


def child_name(name: str, index: int) -> str:
    local, at, host = name.partition("@")
    return f"{local}-{index}{at}{host}"


def child_argv(name: str, queues: str, loglevel: str) -> Callable[[int], list[str]]:
    """The command line of the worker process in slot ``index``."""
    return lambda index: [sys.executable, "-m", "baton", "worker", "--name", child_name(name, index),
                          "--queues", queues, "--loglevel", loglevel]


def supervise(name: str, queues: str, loglevel: str, children_env: Sequence[dict[str, str]],
              argv: Optional[Callable[[int], list[str]]] = None) -> int:
    """Start one worker process per entry of ``children_env`` (extra environment for each), restart
    the ones that exit stalled, and return when every slot's process has exited for good."""
    argv = argv or child_argv(name, queues, loglevel)
    start = lambda index: subprocess.Popen(argv(index), env={**os.environ, **children_env[index]})  # noqa: E731
    procs = [start(index) for index in range(len(children_env))]
    restarts: list[deque] = [deque() for _ in procs]
    codes: list[Optional[int]] = [None] * len(procs)
    stopping = False
    received: list[int] = []  # signals to pass on, by the loop: a child started meanwhile gets them too

    def forward(signum: int, frame) -> None:
        nonlocal stopping
        stopping = True
        received.append(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(code is None for code in codes):
        while received:
            signum = received.pop(0)
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signum)
        for index, proc in enumerate(procs):
            if codes[index] is not None or proc.poll() is None:
                continue
            if not stopping and proc.returncode in RESTART_EXIT_CODES and _may_restart(restarts[index]):
                print(f"baton worker: {child_name(name, index)} exited with status {proc.returncode} (stalled); "
                      f"starting it again", file=sys.stderr, flush=True)
                procs[index] = start(index)
                continue
            if proc.returncode in RESTART_EXIT_CODES and not stopping:
                print(f"baton worker: {child_name(name, index)} exited with status {proc.returncode} "
                      f"{RESTARTS_MAX} times in {RESTART_WINDOW_S:.0f}s; not restarting it", file=sys.stderr, flush=True)
            codes[index] = proc.returncode
        time.sleep(POLL_S)
    return max((code or 0 for code in codes), default=0)


def _may_restart(history: deque) -> bool:
    """Record a restart now, unless ``RESTARTS_MAX`` happened within the last ``RESTART_WINDOW_S``."""
    now = time.monotonic()
    while history and now - history[0] > RESTART_WINDOW_S:
        history.popleft()
    if len(history) >= RESTARTS_MAX:
        return False
    history.append(now)
    return True


EXIT_REFUSED = 5
"""A worker that cannot work here (its store cannot be used; its training processes cannot import their
code, as with a broken torch install) refuses to start, before it takes a job, with the exit code of every
command's infrastructure mistake (``baton.jobs.infra.EXIT_INFRASTRUCTURE``)."""
STORAGE_START_WAIT_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
"""Waits between tries of the start-up probe while the store is unreachable (about a minute in all)."""


def check_storage(storage_url: str, waits: tuple[float, ...] = STORAGE_START_WAIT_S) -> Optional[str]:
    """None when the store can hold jobs; else why not (it ignores conditional writes, or cannot
    be used at all, or stayed unreachable through ``waits``). A worker that cannot commit safely
    must not take jobs; a store that is briefly away (a blip while a node or a restarted slot
    starts) is waited for."""
    from baton.schemas.errors import BatonError, TransientError
    from baton.storage.conditional_probe import check_conditional_writes
    from baton.storage.stores.open import open_store

    for wait in (*waits, None):
        try:
            check_conditional_writes(open_store(storage_url))
            return None
        except TransientError as exc:
            if wait is None:
                return f"baton worker: refusing to start: storage unreachable: {exc}"
            print(f"baton worker: storage unreachable ({exc}); trying again in {wait:.0f}s", file=sys.stderr, flush=True)
            time.sleep(wait)
        except BatonError as exc:
            return f"baton worker: refusing to start: {exc}"
    return None


def run_worker(name: Optional[str], queues: str, concurrency: int, loglevel: str, gpus: Optional[str] = None,
               gpus_per_job: int = 1) -> int:
    from baton.schemas.settings import BatonSettings

    from baton.workers.queue.gpus import plan

    refusal = check_storage(BatonSettings().storage_url)
    if refusal is not None:
        print(refusal, file=sys.stderr, flush=True)
        return EXIT_REFUSED
    name = node_name(name)
    device_count = 0
    if gpus is not None:
        import torch

        device_count = torch.cuda.device_count()
    children = plan(gpus, concurrency, dict(os.environ), device_count, BatonSettings().metrics_port, gpus_per_job)
    if len(children) == 1 and gpus is None:
        run_one(name, queues, loglevel)
        return 0
    return supervise(name, queues, loglevel, children)
