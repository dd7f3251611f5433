"""The environment a job's code starts with: its worker's, less the pool's credentials.

A training process is forked from its worker's forkserver, so it, its checkpoint writer, its ranks, its
data loader workers and whatever the job's code starts inherit the environment the forkserver was
started with (and hold it in memory: ``/proc/self/environ`` reads it back, whatever ``os.environ``
says). The forkserver is therefore started with ``job_environment``: without the worker's Redis URL
(its password), its store's credentials and endpoint (``AWS_*``, ``MINIO_*``), Celery's settings, and any ``BATON_``
variable named like a secret. A training process reaches Redis only through its worker (``channel``)
and the store only through its worker's gate (``baton.storage.stores.gated``), so it needs none of them.
``BATON_JOB_ENV_DROP`` names more variables to withhold (comma-separated, ``*`` patterns: a cloud's
credentials, ``GOOGLE_APPLICATION_CREDENTIALS,AZURE_*``).

What this does not do: the worker's own process still holds them, readable through ``/proc`` by any
process of the same user, as is a credentials file in its home (``~/.aws``).
"""
from __future__ import annotations

import fnmatch
import os
import subprocess
from typing import Mapping, Sequence

from baton.storage.redaction import SECRET_NAME

POOL_VARIABLES = ("AWS_*", "REDIS_*", "CELERY_*", "BATON_REDIS_*", "BATON_STORAGE_URL", "BOTO_*", "MINIO_*")
"""The pool's own: its Redis, its store (MinIO's root user where the deployment's files start one), the
broker's settings."""
DROP_ENV = "BATON_JOB_ENV_DROP"


def kept_from_jobs(name: str, extra: Sequence[str] = ()) -> bool:
    patterns = (*POOL_VARIABLES, *extra)
    upper = name.upper()
    return (any(fnmatch.fnmatchcase(upper, p.upper()) for p in patterns)
            or (upper.startswith("BATON_") and SECRET_NAME.search(upper) is not None))


def job_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    extra = tuple(p.strip() for p in environ.get(DROP_ENV, "").split(",") if p.strip())
    return {name: value for name, value in environ.items() if not kept_from_jobs(name, extra)}


_spawned: list[subprocess.Popen] = []  # kept: multiprocessing waits for these processes itself (os.waitpid)


def spawn_with_job_environment(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """``multiprocessing.util.spawnv_passfds`` (how the forkserver and its resource tracker are started), with
    ``job_environment`` instead of this process's: the same executable and arguments, only ``passfds``
    left open, no signal reset."""
    proc = subprocess.Popen(list(args), executable=path, pass_fds=tuple(sorted(map(int, passfds))), close_fds=True,
                            env=job_environment(), restore_signals=False)
    _spawned.append(proc)
    return proc.pid
