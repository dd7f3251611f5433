"""What every ``baton`` command shares: the Typer app, exit codes, settings, and the one-line answers to
a bad spec, a bad id, a missing job or an infrastructure mistake."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from baton.schemas.errors import SpecError
from baton.schemas.settings import DEFAULT_REDIS_URL, BatonSettings

from baton.jobs.specfile import load_spec

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Preemption-proof PyTorch training jobs.")

EXIT_FAILED = 1
EXIT_BAD_SPEC = 2
EXIT_RUNNING_ELSEWHERE = 4


_debug = False
"""``baton --debug``: an infrastructure mistake shows its whole traceback, not one line."""


def _show_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        typer.echo(f"baton {version('baton')}")
        raise typer.Exit()


@app.callback()
def _options(debug: bool = typer.Option(False, "--debug", help="Show the whole traceback of a Redis or store "
                                        "failure instead of one line."),
             _version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                           help="Print baton's version and exit.")) -> None:
    global _debug
    _debug = debug


def _settings() -> BatonSettings:
    """The settings, or one line naming each that does not validate and exit 5 (a wrong BATON_REDIS_URL
    or BATON_STORAGE_URL is an infrastructure mistake, as an unreachable one is)."""
    from pydantic import ValidationError

    from baton.jobs.infra import EXIT_INFRASTRUCTURE, settings_line

    try:
        return BatonSettings()
    except ValidationError as exc:
        typer.echo(_redacted(settings_line(exc)), err=True)
        raise typer.Exit(EXIT_INFRASTRUCTURE)


def _redacted(line: str) -> str:
    from baton.storage.redaction import Redactor

    return Redactor()(line)


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


def _load_or_exit(spec_path: Path, settings: BatonSettings, sets: Optional[List[str]] = None,
                  code: Optional[Path] = None):
    try:
        return load_spec(spec_path, settings.allowed_prefixes, sets, code)
    except SpecError as exc:
        raise _bad_spec(exc)


def _say_which_redis() -> None:
    """First, on stderr, when the default Redis is used because BATON_REDIS_URL is unset."""
    from baton.schemas.settings import default_redis_notice

    if os.environ.get("BATON_SERVER_URL"):
        return  # (the pool's server holds Redis: this client never reaches it)
    notice = default_redis_notice(os.environ)
    if notice:
        typer.echo(notice, err=True)


def _client():
    from baton.jobs.client import JobClient

    _say_which_redis()
    _settings()  # (one line, not a traceback, for a setting that does not validate)
    return JobClient()


def _job(job_id: str):
    from baton.schemas.errors import JobNotFound

    try:
        return _client().job(job_id)
    except JobNotFound as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)


def _follow(job) -> int:
    """Show a job until it ends or pauses; exit status 0 if it succeeded."""
    from baton.jobs.display import progress_line

    tty = sys.stderr.isatty()
    status = job.wait(progress=True, on_change=None if tty else lambda s: typer.echo(progress_line(s)))
    if tty:
        typer.echo(progress_line(status))
    if status.error:
        typer.echo(f"error: {status.error}", err=True)
    return 0 if status.state.value == "succeeded" else 1


def _infrastructure_line(exc: BaseException) -> Optional[str]:
    from baton.jobs.infra import explain

    line = explain(exc, os.environ.get("BATON_REDIS_URL") or DEFAULT_REDIS_URL)
    return None if line is None else _redacted(line)
