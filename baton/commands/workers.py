"""The commands that start processes on this machine: ``worker``, ``health``, ``demo``."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from baton.commands.common import _say_which_redis, _settings, app

@app.command()
def worker(
    name: Optional[str] = typer.Option(None, "--name", help="Worker name (default: baton-PID@HOST)."),
    queues: str = typer.Option("default", "--queues", "-Q", help="Comma-separated queues to take jobs from."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Jobs at once (one process each)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="'all' or indices like 0,1: one job per GPU, each "
                                       "process pinned to its own (overrides --concurrency)."),
    gpus_per_job: int = typer.Option(1, "--gpus-per-job", min=1, help="GPUs per worker process (with --gpus): "
                                     "serves data-parallel jobs of up to this many ranks (resources.processes)."),
    loglevel: str = typer.Option("INFO", "--loglevel", help="Log level of Celery and of baton's own lines."),
) -> None:
    """Start a worker: a Celery worker with baton's settings, one job per process."""
    from baton.workers.queue.worker_main import run_worker

    _say_which_redis()
    settings = _settings()  # one line for a setting that does not validate
    _check_own_store(settings)
    _check_job_user(settings)
    _warn_open_redis(settings)
    level = logging.getLevelName(loglevel.upper())  # a number for a known level's name
    logging.getLogger("baton").setLevel(level if isinstance(level, int) else logging.INFO)  # (Celery refuses others)
    try:
        code = run_worker(name, queues, concurrency, loglevel, gpus, gpus_per_job)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    raise typer.Exit(code)


def _job_users(settings, command: str):
    """What the worker's jobs will run as (``job_users``), checked without taking a uid; one line and exit 2
    for a setting this machine cannot honour."""
    from baton.workers.attempt.job_users import JobUserError, JobUsers

    try:
        users = JobUsers(settings.job_user, settings.job_uids, claim=False)
        users.check_store(settings.storage_url)
        return users
    except JobUserError as exc:
        typer.echo(f"baton {command}: {exc}", err=True)
        raise typer.Exit(2)


def _check_job_user(settings) -> None:
    users = _job_users(settings, "worker")
    if users.user is None:
        typer.echo(f"warning: {users.describe()}", err=True)


def _check_own_store(settings) -> None:
    """A worker without BATON_STORAGE_URL says which store it uses, and refuses to start where the pool's jobs
    are stored in a shared store (its own would be a directory nobody else reads). Redis away: not checked
    here (the worker waits for it, as for everything else)."""
    import os

    import redis

    from baton.jobs.infra import EXIT_INFRASTRUCTURE
    from baton.schemas.settings import default_store_notice
    from baton.storage.records.connection import connect
    from baton.storage.records import names

    notice = default_store_notice(os.environ)
    if notice is None:
        return
    typer.echo(notice, err=True)
    try:
        shared = names.shared_stores(connect(settings))
    except redis.RedisError:
        return
    if shared:
        typer.echo(f"baton worker: this pool's jobs are stored in {', '.join(shared)}: set BATON_STORAGE_URL to "
                   "the store this worker should use (the default is a directory of this machine)", err=True)
        raise typer.Exit(EXIT_INFRASTRUCTURE)


@app.command()
def health() -> None:
    """Exit 0 if this machine can reach baton's Redis (BATON_REDIS_URL), 1 otherwise: for HEALTHCHECK
    and readiness probes. Also says when jobs here would run as the worker's own user (no isolation), and when
    Redis lets in a client without a password."""
    import redis

    from baton.storage.records.connection import connect

    settings = _settings()
    try:
        connect(settings).ping()
    except redis.RedisError as exc:
        typer.echo(f"unhealthy: cannot reach Redis: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1)
    users = _job_users(settings, "health")
    typer.echo("ok")
    if users.user is None:  # healthy, but the operator should know
        typer.echo(f"warning: {users.describe()}", err=True)
    _warn_open_redis(settings)


def _warn_open_redis(settings) -> None:
    from baton.storage.records.connection import open_redis_warning

    said = open_redis_warning(settings)
    if said is not None:
        typer.echo(said, err=True)


@app.command()
def demo(
    spec: Optional[Path] = typer.Option(None, "--spec", help="The job to run (default: the spiral MLP of "
                                        "examples/spiral.yaml, shipped inside baton)."),
    out: Path = typer.Option(Path("demo-out"), "--out", help="Where logs and fetched artifacts go."),
    redis_url: Optional[str] = typer.Option(None, "--redis-url", help="Use this Redis instead of starting one."),
    storage_url: Optional[str] = typer.Option(None, "--storage-url", help="Use this store instead of a local S3 endpoint."),
) -> None:
    """A job that survives a SIGKILLed worker: local Redis + S3 endpoint, two workers, bit-exact check."""
    from baton.jobs.demo import DEMO_SPEC, missing_parts, run_demo

    missing = missing_parts(redis_url, storage_url)
    if missing:
        typer.echo(f"baton demo: {missing}", err=True)
        raise typer.Exit(2)
    raise typer.Exit(run_demo(spec or DEMO_SPEC, out, redis_url, storage_url))


