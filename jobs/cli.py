"""The ``baton`` command. Each command parses, calls one function, prints.

Commands that run training (``run``, ``worker``, ``demo``) import ``workers`` lazily: the client
commands must work on a machine with only the client's needs installed.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Optional

import typer

from schemas.errors import SpecError
from schemas.settings import BatonSettings

from .specfile import load_spec

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Preemption-proof PyTorch training jobs.")

EXIT_BAD_SPEC = 2


def _settings() -> BatonSettings:
    return BatonSettings()


def _load_or_exit(spec_path: Path, settings: BatonSettings):
    try:
        return load_spec(spec_path, settings.allowed_prefixes)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_BAD_SPEC)


@app.command()
def validate(spec: Path = typer.Argument(..., help="Job spec, YAML or JSON.")) -> None:
    """Check a job spec without running it (exit 2 naming each wrong field)."""
    parsed = _load_or_exit(spec, _settings())
    typer.echo(f"{spec}: valid job spec {parsed.name!r}")


@app.command()
def run(
    spec: Path = typer.Argument(..., help="Job spec, YAML or JSON."),
    job_id: Optional[str] = typer.Option(None, "--id", help="Job id; the same id resumes that job."),
    storage: Optional[str] = typer.Option(None, "--storage", help="file:///path or s3://bucket/prefix "
                                          "[default: BATON_STORAGE_URL, else file://./baton-data]"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar [default: on a terminal]."),
) -> None:
    """Run a job in this process (no Redis); run again with the same --id to resume it.

    Exit codes: 0 done, 1 failed, 2 bad spec, 3 stopped by a signal after a checkpoint (resumable).
    """
    from storage.open import open_store
    from storage.layout import new_job_id
    from workers.local import EXIT_FAILED, run_local

    settings = _settings()
    parsed = _load_or_exit(spec, settings)
    store = open_store(storage or settings.storage_url)
    show_bar = sys.stdout.isatty() if progress is None else progress
    try:
        code = run_local(parsed, job_id or new_job_id(parsed.name), store, settings.allowed_prefixes, show_bar)
    except SpecError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    except Exception:  # the traceback is the useful part: show it, exit 1
        import traceback

        traceback.print_exc()
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(code)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app()
