"""The ``baton`` command. Each command parses, calls one function, prints (``baton/commands/``: the app and
what every command shares, then the commands by what they act on).

Commands that run training (``run``, ``worker``, ``demo``) import ``workers`` lazily: the client
commands must work on a machine with only the client's needs installed.
"""
from __future__ import annotations

import logging
import os
import sys

import typer

from baton.commands import common
from baton.commands import local, jobs, pool, users, workers, dashboard  # noqa: F401 - each registers its commands, in this order
from baton.commands.common import app
from baton.jobs.infra import EXIT_INFRASTRUCTURE

__all__ = ["app", "main"]


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
    from baton.schemas.errors import ServerError

    try:
        app()
    except ServerError as exc:  # the pool's server refused, or cannot be reached: its one line
        typer.echo(str(exc), err=True)
        sys.exit(EXIT_INFRASTRUCTURE if exc.status == 0 or exc.status >= 500 else 1)
    except Exception as exc:  # noqa: BLE001 - one line for Redis or a store that cannot be used; the rest as is
        line = None if common._debug else common._infrastructure_line(exc)
        if line is None:
            raise
        typer.echo(line, err=True)
        sys.exit(EXIT_INFRASTRUCTURE)


