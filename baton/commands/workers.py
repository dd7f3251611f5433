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
    _settings()  # one line for a setting that does not validate
    level = logging.getLevelName(loglevel.upper())  # a number for a known level's name
    logging.getLogger("baton").setLevel(level if isinstance(level, int) else logging.INFO)  # (Celery refuses others)
    try:
        code = run_worker(name, queues, concurrency, loglevel, gpus, gpus_per_job)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    raise typer.Exit(code)


@app.command()
def health() -> None:
    """Exit 0 if this machine can reach baton's Redis (BATON_REDIS_URL), 1 otherwise: for HEALTHCHECK
    and readiness probes."""
    import redis

    from baton.storage.records.connection import connect

    settings = _settings()
    try:
        connect(settings).ping()
    except redis.RedisError as exc:
        typer.echo(f"unhealthy: cannot reach Redis: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1)
    typer.echo("ok")


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


