"""The commands on queued jobs: ``submit``, ``sweep``, ``status``, ``list``, ``watch``, ``cancel``, ``resume``,
``recover``, ``fetch``, ``logs``."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from baton.schemas.errors import SpecError


from baton.commands.common import (EXIT_BAD_SPEC, SET_HELP, _bad_spec, _client, _follow, _id_or_exit, _job, _load_or_exit,
                                   _settings, app)

@app.command()
def submit(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    job_id: Optional[str] = typer.Option(None, "--id", help="Job id (default: NAME-TIME-XXXX)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job until it ends (exit 1 unless it succeeds)."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
    code: Optional[Path] = typer.Option(None, "--code", help="A directory of your code to ship with the job (as "
                                        "code.dir): packed, stored once, first on the import path on every worker."),
) -> None:
    """Validate a spec and queue it (exit 2 naming each wrong field; nothing is queued then)."""
    _id_or_exit(job_id)
    if not os.environ.get("BATON_SERVER_URL"):  # (through the pool's server, its allowed modules apply: it checks)
        _load_or_exit(spec, _settings(), sets, code)
    try:
        job = _client().submit(spec, job_id, overrides=sets, code=code)
    except SpecError as exc:
        raise _bad_spec(exc)
    typer.echo(job.id)
    _warn_if_unserved(job)
    if wait:
        raise typer.Exit(_follow(job))


def _warn_if_unserved(job) -> None:
    """One line when no live worker serves the job's queue now (a misspelled queue, or none started)."""
    queue = job.status().queue
    if not job.client.live_workers(queue):
        typer.echo(f"warning: no live worker serves queue {queue!r} now; the job waits for one "
                   f"(`baton worker --queues {queue}`)", err=True)


@app.command()
def sweep(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    grid: Optional[List[str]] = typer.Option(None, "--grid", help="An axis: dotted.path=V1,V2,... (YAML values); "
                                             "repeatable, every combination is queued."),
    search: Optional[Path] = typer.Option(None, "--search", help="A search file (space, sampler, trials, halving) "
                                          "instead of a grid: trials sampled, the losers stopped at rungs."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
    sweep_id: Optional[str] = typer.Option(None, "--id", help="Sweep id (default: NAME-sweep-TIME-XXXX); jobs are ID-N."),
    code: Optional[Path] = typer.Option(None, "--code", help="A directory of your code to ship with the job (as "
                                        "code.dir): packed, stored once, first on the import path on every worker."),
) -> None:
    """Queue one job per grid point, sharing a sweep id; all are validated first (exit 2 and nothing
    queued if any is invalid). Compare them with `baton list --sweep ID`. With --search, a search:
    follow it with `baton sweep-status ID`."""
    _id_or_exit(sweep_id)
    if (grid is None) == (search is None):
        typer.echo("baton sweep: give --grid (a full grid) or --search FILE (a search), not both or neither", err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    try:
        if search is not None:
            queued = _client().search(spec, search, overrides=sets, search_id=sweep_id, code=code)
        else:
            queued = _client().sweep(spec, grid or [], overrides=sets, sweep_id=sweep_id, code=code)
    except SpecError as exc:
        raise _bad_spec(exc)
    if search is not None:
        many = "s" if len(queued.jobs) != 1 else ""
        typer.echo(f"search {queued.id}: {len(queued.jobs)} trial{many} queued (follow it: baton sweep-status {queued.id})")
        return
    typer.echo(f"sweep {queued.id}: {len(queued.jobs)} job{'s' if len(queued.jobs) != 1 else ''} queued")
    for job in queued.jobs:
        typer.echo(job.id)


@app.command("sweep-status")
def sweep_status(search_id: str = typer.Argument(..., help="The search's id (baton sweep --search printed it)."),
                 report: Optional[Path] = typer.Option(None, "--report", help="Also write the search's report into "
                                                       "this directory: report.md (the table) and rungs.png.")) -> None:
    """A search's trials: their parameters, standing (running, stopped at a rung, finished), metric at each
    rung and best value, and the best trial once it has finished."""
    from baton.schemas.errors import JobNotFound

    from baton.jobs.display import search_table

    client = _client()
    try:
        results = client.search_results(search_id)
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    typer.echo(search_table(results))
    if report is not None:
        from baton.searches.report import write_report

        try:
            written = write_report(results, report)
        except OSError as exc:
            typer.echo(f"error: cannot write the report into {report}: {exc.strerror or exc}", err=True)
            raise typer.Exit(1)
        typer.echo(f"report: {', '.join(str(p) for p in written)}")


@app.command("sweep-cancel")
def sweep_cancel(sweep_id: str = typer.Argument(..., help="A sweep's or search's id.")) -> None:
    """Cancel a sweep or a search: every job of it that has not ended (waiting, running, paused), and a search
    takes no further step."""
    from baton.schemas.errors import JobNotFound

    try:
        answers = _client().cancel_sweep(sweep_id)
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    counts: dict[str, int] = {}
    for answer in answers.values():
        counts[answer] = counts.get(answer, 0) + 1
    said = {"cancelled": "cancelled", "requested": "stopping at their next step"}
    typer.echo(f"{sweep_id}: " + ", ".join(f"{n} {said.get(a, a)}" for a, n in sorted(counts.items())))


@app.command()
def status(job_id: Optional[str] = typer.Argument(None, help="A job id; all recent jobs when left out."),
           history: bool = typer.Option(False, "--events", help="The job's history instead: every event (submitted, "
                                        "claimed, yielded, lost, resumed, ended...), oldest first.")) -> None:
    """A job's state, attempt, worker, progress, checkpoints and error; or a table of recent jobs."""
    from baton.jobs.display import details, events_table, table

    if job_id and history:
        typer.echo(events_table(_job(job_id).events()))
    elif job_id:
        typer.echo(details(_job(job_id).status()))
    elif history:
        typer.echo("--events needs a job id", err=True)
        raise typer.Exit(2)
    else:
        typer.echo(table(_client().list()))


@app.command("list")
def list_jobs(
    limit: int = typer.Option(50, help="How many, newest first."),
    sweep_id: Optional[str] = typer.Option(None, "--sweep", help="Only this sweep's jobs, best monitored value first."),
) -> None:
    """Recent jobs as a table; with --sweep, a sweep's jobs compared by their best monitored value."""
    from baton.schemas.errors import JobNotFound

    from baton.jobs.display import search_table, sweep_table, table

    if sweep_id is None:
        typer.echo(table(_client().list(limit)))
        return
    try:
        found = _client().sweep_results(sweep_id)
        typer.echo(sweep_table(found) if isinstance(found, list) else search_table(found))
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


@app.command(context_settings={"ignore_unknown_options": True})  # (a negative priority is not an option)
def priority(job_id: str, value: int = typer.Argument(..., metavar="PRIORITY", help="The new priority (higher "
                                                      "starts first).")) -> None:
    """Change a waiting or running job's priority: a waiting one moves to its new place in line, a running one
    may then make a lower job yield (or be asked to yield to a higher one)."""
    try:
        _job(job_id).set_priority(value)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    typer.echo(f"{job_id}: priority {value}")


@app.command()
def resume(job_id: str, pause_at: Optional[int] = typer.Option(
        None, "--pause-at", min=1, help="A paused job: pause again at the end of this epoch (an epoch-based run) or at the first validation at or past this step (a step-based run).")) -> None:
    """Queue a cancelled, failed or paused job again, from its latest checkpoint."""
    try:
        attempt = _job(job_id).resume(pause_at)
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
                              "files, for tensorboard --logdir) | code (the archive of the code the job ships)"),
    out: Path = typer.Option(Path("."), "-o", "--out", help="Directory to write into (a folder per job)."),
    storage: Optional[str] = typer.Option(None, "--storage", help="Read from this store without Redis (a "
                                          "`baton run` job; default: the job's record, else BATON_STORAGE_URL)."),
) -> None:
    """Download a job's best or latest checkpoint (sha256-verified), its final artifacts, its
    TensorBoard event files, or the code it ships."""
    from baton.schemas.errors import JobNotFound
    from baton.storage.layout import JobPaths
    from baton.storage.stores.open import open_client_store

    from baton.jobs.downloads import download

    import redis

    try:
        if storage is None:
            try:
                path = _client().job(job_id).download(out, which=which)
            except JobNotFound:  # no record: a `baton run` job, in the configured store
                path = download(open_client_store(_settings().storage_url), job_id, out, which)
            except redis.RedisError:  # no Redis to ask (a `baton run` user's usual case): the configured store,
                store = open_client_store(_settings().storage_url)  # if it holds the job; else Redis's line
                if not store.exists(JobPaths(job_id).manifest):
                    raise
                path = download(store, job_id, out, which)
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
    from baton.jobs.server_client import server_settings

    if storage is None and server_settings() is not None:
        job = _job(job_id)
        if follow:
            job.follow_logs(lambda text: (sys.stdout.write(text), sys.stdout.flush()) and None, attempt)
        else:
            sys.stdout.write(job.logs(attempt))
        return
    try:
        source = open_job_log(job_id, storage, _settings())
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    if follow:
        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        source.follow(attempt, write)
        if source.stopped:
            typer.echo(source.stopped, err=True)
    else:
        text = source.read(attempt)
        if not text:
            typer.echo(f"job {job_id} has no log lines yet", err=True)
        sys.stdout.write(text)


