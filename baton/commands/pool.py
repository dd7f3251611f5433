"""The commands on a queue's pool: ``queue`` (what waits, in which order, and why), ``quota set``,
``quota list``, ``quota rm`` (the worker slots a team is guaranteed), ``drain`` and ``undrain`` (a
worker's job yields and it takes no other, or takes jobs again)."""
from __future__ import annotations

from typing import Optional

import typer

from baton.commands.common import _client, app

quota_app = typer.Typer(help="The worker slots each team is guaranteed on a queue.", no_args_is_help=True)
app.add_typer(quota_app, name="quota")


@app.command()
def queue(name: Optional[str] = typer.Option(None, "--queue", "-Q", help="Only this queue (default: every queue).")) -> None:
    """The waiting jobs in the order they will start, with team, priority, position and why each waits;
    the running jobs with their worker, team and priority; each team's slots against its quota."""
    from baton.jobs.display import queue_table

    views = _client().queue(name)
    typer.echo("\n\n".join(queue_table(view) for view in views) if views else "no queues yet")


@quota_app.command("set")
def quota_set(
    team: str = typer.Argument(..., metavar="TEAM", help="The team (resources.team of its jobs)."),
    queue_name: Optional[str] = typer.Option(None, "--queue", "-Q", help="The queue (default: default)."),
    slots: int = typer.Option(..., "--slots", help="Worker slots guaranteed (a job on N nodes holds N)."),
) -> None:
    """Guarantee TEAM SLOTS worker slots of a queue: below it, its waiting jobs start before those of teams
    at or above theirs. Beyond it, the team borrows slots while they are idle."""
    try:
        warnings = _client().set_quota(team, queue_name or "default", slots)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    typer.echo(f"team {team}: {slots} slot(s) of queue {queue_name or 'default'}"
               + ("" if queue_name else " (no --queue given: the queue named default)"))
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)


@quota_app.command("list")
def quota_list() -> None:
    """Every quota, with each team's slots in use now."""
    from baton.jobs.display import quota_table

    client = _client()
    rows = []
    for queue_name, quotas in client.quotas().items():
        usage = client.usage(queue_name)
        rows += [[queue_name, team, str(slots), str(usage.get(team, 0))] for team, slots in sorted(quotas.items())]
    if not rows:
        typer.echo("no quotas: every team shares every queue in order of priority and submit time")
        return
    typer.echo(quota_table(rows))


@quota_app.command("rm")
def quota_rm(
    team: str = typer.Argument(..., metavar="TEAM", help="The team."),
    queue_name: str = typer.Option("default", "--queue", "-Q", help="The queue."),
) -> None:
    """Remove TEAM's quota on a queue (exit 1 if it had none)."""
    try:
        removed = _client().remove_quota(team, queue_name)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    if not removed:
        typer.echo(f"team {team} has no quota on queue {queue_name}", err=True)
        raise typer.Exit(1)
    typer.echo(f"team {team}: quota on queue {queue_name} removed")


WORKER_ARG = typer.Argument(..., help="The worker (name@host, or its name when one live worker has it).")


def _set_drained(worker: str, drained: bool, said: tuple[str, str]) -> None:
    """Drain or undrain WORKER, saying ``said[0]`` when that changed it and ``said[1]`` when it did not."""
    client = _client()
    try:
        name, changed = client.drain(worker) if drained else client.undrain(worker)
    except ValueError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2)
    typer.echo(f"worker {name}: {said[0] if changed else said[1]}")


@app.command()
def drain(worker: str = WORKER_ARG) -> None:
    """WORKER's job yields at its next optimizer step (checkpointed and re-queued: nothing is lost, nothing
    counted) and WORKER takes no other job until `baton undrain WORKER`."""
    _set_drained(worker, True, ("drained", "drained already"))


@app.command()
def undrain(worker: str = WORKER_ARG) -> None:
    """Let a drained WORKER take jobs again."""
    _set_drained(worker, False, ("takes jobs again", "was not drained"))
