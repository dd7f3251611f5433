"""The ``baton`` command. Each command parses, calls one function, prints.

Commands that run training (``run``, ``worker``, ``demo``) import ``workers`` lazily: the client
commands must work on a machine with only the client's needs installed.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from baton.schemas.errors import CheckpointWriteFailed, FencedOut, RunningElsewhere, SpecError
from baton.schemas.settings import DEFAULT_REDIS_URL, BatonSettings

from baton.jobs.infra import EXIT_INFRASTRUCTURE
from baton.jobs.specfile import check_user_targets, load_spec

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Preemption-proof PyTorch training jobs.")

EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_RUNNING_ELSEWHERE = 4


_debug = False
"""``baton --debug``: an infrastructure mistake shows its whole traceback, not one line."""


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the whole traceback of a Redis or store "
                                        "failure instead of one line.")) -> None:
    global _debug
    _debug = debug


def _settings() -> BatonSettings:
    return BatonSettings()


SET_HELP = "Override a spec field: dotted.path=VALUE (a YAML value: 1e-3, true, [64, 64]); repeatable."


def _bad_spec(exc: SpecError) -> typer.Exit:
    typer.echo(str(exc), err=True)
    return typer.Exit(EXIT_BAD_SPEC)


def _id_or_exit(job_id: Optional[str], option: str = "--id") -> Optional[str]:
    """A given job id, checked before anything runs: one line and exit 2 if it is not a valid id."""
    from baton.storage.layout import check_job_id

    if job_id is None:
        return None
    try:
        return check_job_id(job_id)
    except ValueError as exc:
        typer.echo(f"{option}: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_SPEC)


def _load_or_exit(spec_path: Path, settings: BatonSettings, sets: Optional[List[str]] = None):
    try:
        return load_spec(spec_path, settings.allowed_prefixes, sets)
    except SpecError as exc:
        raise _bad_spec(exc)


@app.command()
def validate(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Check a job spec without running it (exit 2 naming each wrong field)."""
    parsed = _load_or_exit(spec, _settings(), sets)
    for note, _ in check_user_targets(parsed):
        typer.echo(f"  {note}")
    typer.echo(f"{spec}: valid job spec {parsed.name!r}")


@app.command()
def run(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    job_id: Optional[str] = typer.Option(None, "--id", help="Job id; the same id resumes that job."),
    storage: Optional[str] = typer.Option(None, "--storage", help="file:///path or s3://bucket/prefix "
                                          "(default: BATON_STORAGE_URL, else file://./baton-data)"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: on a terminal)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Run a job in this process (no Redis); run again with the same --id to resume it.

    Exit codes: 0 done, 1 failed, 2 bad spec, 3 stopped by a signal after a checkpoint (resumable),
    4 the job is running in another `baton run` or was submitted to a queue (nothing done), 130 aborted by a second signal (the next
    run resumes from the last committed checkpoint).
    """
    from baton.storage.checkpointing import writer_start
    from baton.storage.layout import JobPaths, new_job_id
    from baton.storage.stores.open import open_client_store, open_store

    from baton.jobs.infra import STORE_ERRORS

    settings = _settings()
    job_id = _id_or_exit(job_id)
    parsed = _load_or_exit(spec, settings, sets)
    job_id = job_id or new_job_id(parsed.name)
    # a wrong bucket, credentials or endpoint is said now, in a few seconds, before anything is built
    open_client_store(storage or settings.storage_url).read_versioned(JobPaths(job_id).manifest)
    if parsed.resources.ranks == 1:  # ranks start writers of their own
        writer_start.prestart()  # the checkpoint writer imports torch on one core while this process does on the other
    from baton.workers.attempt.local import run_local  # (torch: seconds to import)

    store = open_store(storage or settings.storage_url)
    show_bar = sys.stdout.isatty() if progress is None else progress
    try:
        code = run_local(parsed, job_id, store, settings.allowed_prefixes, show_bar)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    except RunningElsewhere as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_RUNNING_ELSEWHERE)
    except FencedOut as exc:  # another run took the job over (this one was thought gone): it committed nothing more
        typer.echo(f"stopped: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED)
    except CheckpointWriteFailed as exc:  # this machine's fault: nothing committed is lost
        typer.echo(f"error: {exc}\nthe job did not fail: free some space and run again with --id {job_id} to resume "
                   "from its last committed checkpoint", err=True)
        raise typer.Exit(EXIT_FAILED)
    except STORE_ERRORS as exc:  # the store went away or refused us mid-run: what it holds is whole
        typer.echo(f"{_infrastructure_line(exc)}\nthe job did not fail: run again with --id {job_id} when the store is "
                   "back, to resume from its last committed checkpoint", err=True)
        raise typer.Exit(EXIT_INFRASTRUCTURE)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the job's failure (an asyncio.CancelledError is a BaseException):
        from baton.workers.training.failures import failure  # the cause and the user's own frames; the whole traceback is in the job's log
        from baton.storage.redaction import Redactor

        where = f"baton logs {job_id}" + ("" if store.url == settings.storage_url else f" --storage {store.url}")
        typer.echo(Redactor()(failure(exc, settings.allowed_prefixes, where)), err=True)
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(code)


def _say_which_redis() -> None:
    """First, on stderr, when the default Redis is used because BATON_REDIS_URL is unset."""
    from baton.schemas.settings import default_redis_notice

    notice = default_redis_notice(os.environ)
    if notice:
        typer.echo(notice, err=True)


def _client():
    from baton.jobs.client import JobClient

    _say_which_redis()
    return JobClient()


def _job(job_id: str):
    from baton.schemas.errors import JobNotFound

    try:
        return _client().job(job_id)
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)


def _follow(job) -> int:
    """Show a job until it ends; exit status 0 if it succeeded."""
    from baton.jobs.display import progress_line

    tty = sys.stderr.isatty()
    status = job.wait(progress=True, on_change=None if tty else lambda s: typer.echo(progress_line(s)))
    if tty:
        typer.echo(progress_line(status))
    if status.error:
        typer.echo(f"error: {status.error}", err=True)
    return 0 if status.state.value == "succeeded" else 1


@app.command()
def submit(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    job_id: Optional[str] = typer.Option(None, "--id", help="Job id (default: NAME-TIME-XXXX)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job until it ends (exit 1 unless it succeeds)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Validate a spec and queue it (exit 2 naming each wrong field; nothing is queued then)."""
    _id_or_exit(job_id)
    _load_or_exit(spec, _settings(), sets)
    try:
        job = _client().submit(spec, job_id, overrides=sets)
    except SpecError as exc:
        raise _bad_spec(exc)
    typer.echo(job.id)
    if wait:
        raise typer.Exit(_follow(job))


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    grid: List[str] = typer.Option(..., "--grid", help="An axis: dotted.path=V1,V2,... (YAML values); repeatable, "
                                   "every combination is queued."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
    sweep_id: Optional[str] = typer.Option(None, "--id", help="Sweep id (default: NAME-sweep-TIME-XXXX); jobs are ID-N."),
) -> None:
    """Queue one job per grid point, sharing a sweep id; all are validated first (exit 2 and nothing
    queued if any is invalid). Compare them with `baton list --sweep ID`."""
    _id_or_exit(sweep_id)
    try:
        queued = _client().sweep(spec, grid, overrides=sets, sweep_id=sweep_id)
    except SpecError as exc:
        raise _bad_spec(exc)
    typer.echo(f"sweep {queued.id}: {len(queued.jobs)} jobs queued")
    for job in queued.jobs:
        typer.echo(job.id)


@app.command()
def status(job_id: Optional[str] = typer.Argument(None, help="A job id; all recent jobs when left out.")) -> None:
    """A job's state, attempt, worker, progress, checkpoints and error; or a table of recent jobs."""
    from baton.jobs.display import details, table

    if job_id:
        typer.echo(details(_job(job_id).status()))
    else:
        typer.echo(table(_client().list()))


@app.command("list")
def list_jobs(
    limit: int = typer.Option(50, help="How many, newest first."),
    sweep_id: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's jobs, best monitored value first."),
) -> None:
    """Recent jobs as a table; with --sweep, a sweep's jobs compared by their best monitored value."""
    from baton.schemas.errors import JobNotFound

    from baton.jobs.display import sweep_table, table

    if sweep_id is None:
        typer.echo(table(_client().list(limit)))
        return
    try:
        typer.echo(sweep_table(_client().sweep_results(sweep_id)))
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)


@app.command()
def watch(job_id: str) -> None:
    """Follow a job with a live progress bar until it ends."""
    raise typer.Exit(_follow(_job(job_id)))


@app.command()
def cancel(job_id: str) -> None:
    """Cancel: at once if the job is waiting, else at its next step after a checkpoint."""
    result = _job(job_id).cancel()
    typer.echo({"cancelled": f"{job_id}: cancelled", "requested": f"{job_id}: cancel requested; it stops at its next "
                "step after a checkpoint"}.get(result, f"{job_id}: already {result}"))


@app.command()
def resume(job_id: str) -> None:
    """Queue a cancelled or failed job again, from its latest checkpoint."""
    try:
        attempt = _job(job_id).resume()
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    typer.echo(f"{job_id}: queued as attempt {attempt}")


@app.command()
def recover(
    job_id: Optional[str] = typer.Argument(None, help="The job whose record to rebuild."),
    all_jobs: bool = typer.Option(False, "--all", help="Every job the store (BATON_STORAGE_URL) holds."),
) -> None:
    """Rebuild job records that Redis lost, from object storage (spec.json + manifest.json): a finished
    job becomes succeeded, any other is queued again as a new attempt from its latest checkpoint."""
    from baton.schemas.errors import JobNotFound

    if (job_id is None) == (not all_jobs):
        typer.echo("give a JOB or --all (not both)", err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    try:
        recovered = _client().recover(job_id)
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    for item in recovered:
        typer.echo(item.describe())
    if not recovered:
        typer.echo("no jobs in the store")


@app.command()
def fetch(
    job_id: str,
    which: str = typer.Option("best", "--which", help="best | latest | final | tensorboard (every attempt's event "
                              "files, for tensorboard --logdir)"),
    out: Path = typer.Option(Path("."), "-o", "--out", help="Directory to write into (a folder per job)."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Read from this store without Redis (a "
                                          "`baton run` job; default: the job's record, else BATON_STORAGE_URL)."),
) -> None:
    """Download a job's best or latest checkpoint (sha256-verified), its final artifacts, or its
    TensorBoard event files."""
    from baton.schemas.errors import JobNotFound
    from baton.storage.stores.open import open_client_store

    from baton.jobs.client import download

    try:
        if storage is None:
            try:
                path = _client().job(job_id).download(out, which=which)
            except JobNotFound:  # no record: a `baton run` job, in the configured store
                path = download(open_client_store(_settings().storage_url), job_id, out, which)
        else:
            path = download(open_client_store(storage), job_id, out, which)
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    typer.echo(str(path))


@app.command()
def logs(
    job_id: str,
    attempt: Optional[int] = typer.Option(None, "--attempt", help="Only this attempt's lines."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Keep showing new lines until the job ends."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Read from this store without Redis (a "
                                          "`baton run` job; default: the job's record, else BATON_STORAGE_URL)."),
) -> None:
    """A job's own output, every attempt in order: baton's lines and the job's stdout, stderr and
    logging, secrets redacted. Stored every few seconds while it runs; -f follows it live."""
    from baton.jobs.logs import open_job_log

    try:
        source = open_job_log(job_id, storage, _settings())
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    if follow:
        source.follow(attempt, lambda text: (sys.stdout.write(text), sys.stdout.flush()))
        if source.stopped:
            typer.echo(source.stopped, err=True)
    else:
        text = source.read(attempt)
        if not text:
            typer.echo(f"job {job_id} has no log lines yet", err=True)
        sys.stdout.write(text)


@app.command()
def worker(
    name: Optional[str] = typer.Option(None, "--name", help="Worker name (default: baton-PID@HOST)."),
    queues: str = typer.Option("default", "--queues", "-Q", help="Comma-separated queues to take jobs from."),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="Jobs at once (one process each)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="'all' or indices like 0,1: one job per GPU, each "
                                       "process pinned to its own (overrides --concurrency)."),
    gpus_per_job: int = typer.Option(1, "--gpus-per-job", min=1, help="GPUs per worker process (with --gpus): "
                                     "serves data-parallel jobs of up to this many ranks (resources.processes)."),
    loglevel: str = typer.Option("INFO", "--loglevel", help="Celery log level."),
) -> None:
    """Start a worker: a Celery worker with baton's settings, one job per process."""
    from baton.workers.queue.worker_main import run_worker

    _say_which_redis()
    logging.getLogger("baton").setLevel(logging.INFO)
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

    try:
        connect(_settings()).ping()
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


def _show_baton_warnings() -> None:
    """baton's own warnings as one `warning: ...` line on stderr (Python's format adds a file and a line)."""
    import warnings

    from baton.schemas.errors import LocalStoreWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, LocalStoreWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main() -> None:
    import os

    from baton.schemas.settings import unknown_variables

    # your packages in the directory you run baton from import as they would under `python -m`
    # (uvicorn and gunicorn do the same for their app); baton's own live under `baton.`, so a folder of
    # yours named jobs/ or workers/ shadows nothing of baton's
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    _show_baton_warnings()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in unknown_variables(os.environ):
        typer.echo(f"warning: {name} is not a baton setting (misspelled?); it is ignored", err=True)
    try:
        app()
    except Exception as exc:  # noqa: BLE001 - one line for Redis or a store that cannot be used; the rest as is
        line = None if _debug else _infrastructure_line(exc)
        if line is None:
            raise
        typer.echo(line, err=True)
        sys.exit(EXIT_INFRASTRUCTURE)


def _infrastructure_line(exc: BaseException) -> Optional[str]:
    from baton.jobs.infra import explain
    from baton.storage.redaction import Redactor

    line = explain(exc, os.environ.get("BATON_REDIS_URL") or DEFAULT_REDIS_URL)
    return None if line is None else Redactor()(line)
