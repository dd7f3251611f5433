"""``baton validate`` and ``baton run``: a spec checked, a job trained in this process (no Redis)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from baton.schemas.errors import CheckpointWriteFailed, FencedOut, RunningElsewhere, SpecError
from baton.schemas.settings import BatonSettings

from baton.jobs.infra import EXIT_INFRASTRUCTURE
from baton.jobs.specfile import check_user_targets

from baton.commands.common import (EXIT_BAD_SPEC, EXIT_FAILED, EXIT_RUNNING_ELSEWHERE, SET_HELP, _id_or_exit,
                                   _infrastructure_line, _load_or_exit, _settings, app)

@app.command()
def validate(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=SET_HELP),
) -> None:
    """Check a job spec without running it (exit 2 naming each wrong field). With BATON_SERVER_URL, the pool's
    server checks it too (the modules it allows)."""
    if os.environ.get("BATON_SERVER_URL"):
        _validate_through_server(spec, sets)
        return
    parsed = _load_or_exit(spec, _settings(), sets)
    for note, _ in check_user_targets(parsed):
        typer.echo(f"  {note}")
    typer.echo(f"{spec}: valid job spec {parsed.name!r}")


def _validate_through_server(spec: Path, sets: Optional[List[str]]) -> None:
    """The spec's targets checked here (where its code is), then the whole spec by the pool's server."""
    from baton.jobs.server_client import ServerClient
    from baton.jobs.server_code import checked_here
    from baton.jobs.specfile import read_raw, with_overrides
    from baton.schemas.overrides import normalize

    try:
        raw = with_overrides(read_raw(spec), normalize(sets))
        parsed = checked_here(raw)
        ServerClient(BatonSettings()).validate(raw)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    for note, _ in check_user_targets(parsed):
        typer.echo(f"  {note}")
    typer.echo(f"{spec}: valid job spec {parsed.name!r} (checked by the pool's server too)")


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
    from baton.storage.layout import JobPaths, new_job_id
    from baton.storage.stores.open import open_client_store, open_store

    settings = _settings()
    job_id = _id_or_exit(job_id)
    parsed = _load_or_exit(spec, settings, sets)
    _import_code_dir(parsed)
    job_id = job_id or new_job_id(parsed.name)
    # a wrong bucket, credentials or endpoint is said now, in a few seconds, before anything is built
    first = open_client_store(storage or settings.storage_url)
    first.read_versioned(JobPaths(job_id).manifest)
    first.list(JobPaths(job_id).root)  # (a GET's 404 may be a web server's: a listing says whether this is S3)
    store = open_store(storage or settings.storage_url)
    show_bar = sys.stdout.isatty() if progress is None else progress
    raise typer.Exit(_train_here(parsed, job_id, store, settings, show_bar))


def _import_code_dir(parsed) -> None:
    """``baton run`` imports a spec's ``code.dir`` in place, first (and so do its ranks); it installs nothing."""
    code = parsed.code
    if code is None:
        return
    if code.pip:
        typer.echo(f"code.pip: `baton run` installs nothing; it imports {' '.join(code.pip)} from this environment",
                   err=True)
    if code.dir is None:
        if code.digest is not None:
            typer.echo(f"code.digest: `baton run` imports your code from code.dir, not from a stored archive; fetch it "
                       "(`baton fetch JOB --which code`), unpack it and set code.dir", err=True)
            raise typer.Exit(EXIT_BAD_SPEC)
        return
    if not Path(code.dir).is_dir():
        typer.echo(f"code.dir: {code.dir} is not a directory", err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    directory = str(Path(code.dir).resolve())
    sys.path.insert(0, directory)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [directory, os.environ.get("PYTHONPATH")]))


def _train_here(parsed, job_id: str, store, settings: BatonSettings, show_bar: bool) -> int:
    """``baton run``'s exit code: the job's, or one line saying what stopped it, and what to do next."""
    from baton.jobs.infra import STORE_ERRORS
    from baton.storage.checkpointing import writer_start
    from baton.workers.attempt.local import run_local  # (torch: seconds to import)
    from baton.workers.parallel import spare_ranks

    # forked with torch imported: they import nothing themselves
    if parsed.resources.ranks == 1:  # (ranks start writers of their own)
        writer_start.fork_spare()  # the checkpoint writer
    else:
        spare_ranks.fork(parsed.resources.processes - 1)  # ranks 1..N-1
    try:
        return run_local(parsed, job_id, store, settings.allowed_prefixes, show_bar)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        return EXIT_BAD_SPEC
    except RunningElsewhere as exc:
        typer.echo(str(exc), err=True)
        return EXIT_RUNNING_ELSEWHERE
    except FencedOut as exc:  # another run took the job over (this one was thought gone): it committed nothing more
        typer.echo(f"stopped: {exc}", err=True)
        return EXIT_FAILED
    except CheckpointWriteFailed as exc:  # this machine's fault: nothing committed is lost
        typer.echo(f"error: {exc}\nthe job did not fail: free some space and run again with --id {job_id} to resume "
                   "from its last committed checkpoint", err=True)
        return EXIT_FAILED
    except STORE_ERRORS as exc:  # the store went away or refused us mid-run: what it holds is whole
        typer.echo(f"{_infrastructure_line(exc)}\nthe job did not fail: run again with --id {job_id} when the store is "
                   "back, to resume from its last committed checkpoint", err=True)
        return EXIT_INFRASTRUCTURE
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - the job's failure (an asyncio.CancelledError is a BaseException):
        from baton.storage.redaction import Redactor
        from baton.workers.training.failures import failure  # the cause and the user's own frames

        where = f"baton logs {job_id}" + ("" if store.url == settings.storage_url else f" --storage {store.url}")
        typer.echo(Redactor()(failure(exc, settings.allowed_prefixes, where)), err=True)  # the whole traceback: the log
        return EXIT_FAILED
