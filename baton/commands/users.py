"""The commands on who may use the pool: ``users add|list|rm|token`` (principals and their tokens),
``teams set|list`` (each team's max priority) and ``audit`` (what the pool's server was asked, by whom). An admin's work: in direct mode whoever holds the Redis
URL is that admin (the operator making the first one)."""
from __future__ import annotations

from typing import List, Optional

import typer

from baton.commands.common import EXIT_BAD_SPEC, _client, app

users_app = typer.Typer(help="The pool's users and service accounts, their roles and tokens.", no_args_is_help=True)
teams_app = typer.Typer(help="Each team's limits.", no_args_is_help=True)
app.add_typer(users_app, name="users")
app.add_typer(teams_app, name="teams")


def _principals():
    """The principals: through the pool's server (an admin's token) when BATON_SERVER_URL is set, else in Redis."""
    return _client().principals()


def _refuse(exc: Exception) -> typer.Exit:
    typer.echo(str(exc), err=True)
    return typer.Exit(EXIT_BAD_SPEC)


def _show_token(name: str, token: str) -> None:
    """The token on stdout (alone, for a script to keep), what to do with it on stderr."""
    typer.echo(token)
    typer.echo(f"this is {name}'s token: it is shown once and stored only as a hash; give it to them as "
               "BATON_TOKEN (or in ~/.config/baton/token)", err=True)


@users_app.command("add")
def users_add(
    name: str = typer.Argument(..., help="The user's name (lower case letters, digits, '.', '_', '-')."),
    teams: Optional[List[str]] = typer.Option(None, "--team", help="A team it submits to and reads (repeatable)."),
    role: str = typer.Option("member", "--role", help="member (its own jobs), lead (every job of its teams) or admin "
                             "(the pool: quotas, team limits, drain, users, audit; every job)."),
    service: bool = typer.Option(False, "--service", help="A service account (a CI pipeline, a scheduler), not a person."),
) -> None:
    """Add a user and print its token, once."""
    from pydantic import ValidationError

    from baton.schemas.principals import Principal
    from baton.storage.records.principals import PrincipalError

    try:
        who = Principal(name=name, role=role, teams=tuple(teams or ()), service=service)
    except ValidationError as exc:
        raise _refuse(ValueError("; ".join(f"{'.'.join(map(str, e['loc'])) or 'user'}: {e['msg']}"
                                           for e in exc.errors(include_url=False))))
    if who.role.value != "admin" and not who.teams:
        raise _refuse(ValueError(f"a {who.role.value} needs a team (--team T): it submits to and reads only its teams"))
    try:
        token = _principals().add(who)
    except PrincipalError as exc:
        raise _refuse(exc)
    _show_token(name, token)


@users_app.command("list")
def users_list() -> None:
    """Every user: role, teams, whether a service account, when made. Tokens are never shown."""
    from baton.jobs.display import users_table

    found = _principals().list()
    typer.echo(users_table(found) if found else "no users: the pool is open only to whoever holds its Redis URL")


@users_app.command("rm")
def users_rm(name: str = typer.Argument(..., help="The user.")) -> None:
    """Remove a user: its token is refused from now on (its jobs stay)."""
    from baton.storage.records.principals import PrincipalError

    try:
        _principals().remove(name)
    except PrincipalError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    typer.echo(f"user {name}: removed")


@users_app.command("token")
def users_token(name: str = typer.Argument(..., help="The user."),
                rotate: bool = typer.Option(False, "--rotate", help="Make a new token; the old one is refused from now on.")) -> None:
    """Give a user a new token (--rotate): tokens are stored only as hashes, so a lost one cannot be shown again."""
    from baton.storage.records.principals import PrincipalError

    if not rotate:
        typer.echo(f"a token is shown only when it is made: `baton users token {name} --rotate` makes a new one "
                   "(the old one is then refused)", err=True)
        raise typer.Exit(EXIT_BAD_SPEC)
    try:
        token = _principals().rotate(name)
    except PrincipalError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1)
    _show_token(name, token)


@teams_app.command("set")
def teams_set(
    team: str = typer.Argument(..., metavar="TEAM", help="The team (resources.team of its jobs)."),
    max_priority: Optional[int] = typer.Option(None, "--max-priority", help="The highest priority its jobs may have "
                                               "(submitted or changed later); jobs already above it keep theirs."),
    no_limit: bool = typer.Option(False, "--no-max-priority", help="Remove the team's limit."),
) -> None:
    """Set a team's limits."""
    if (max_priority is None) == (not no_limit):
        raise _refuse(ValueError("give --max-priority N or --no-max-priority"))
    try:
        _client().set_max_priority(team, max_priority)
    except ValueError as exc:
        raise _refuse(exc)
    typer.echo(f"team {team}: " + (f"max priority {max_priority}" if max_priority is not None else "no max priority"))


@teams_app.command("list")
def teams_list() -> None:
    """Every team's limits."""
    limits = _client().limits()
    if not limits:
        typer.echo("no team has limits: any priority may be asked for")
        return
    for team, limit in limits.items():
        typer.echo(f"{team}: max priority {limit}")


def _since(text: str) -> float:
    """``1h``, ``30m``, ``2d``, ``90s`` ago, as a unix time."""
    import re
    import time

    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if not found:
        raise ValueError(f"--since: {text!r} is not a duration such as 90s, 30m, 1h or 2d")
    return time.time() - float(found.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]


@app.command()
def audit(since: Optional[str] = typer.Option(None, "--since", help="Only what was asked this long ago or later: "
                                              "90s, 30m, 1h, 2d."),
          user: Optional[str] = typer.Option(None, "--user", help="Only this user's requests."),
          limit: int = typer.Option(1000, "--limit", min=1, help="At most this many, newest first.")) -> None:
    """What the pool's server was asked, newest first: when, who, what, on what, allowed or refused and why,
    from where. Redis keeps the latest 100,000 entries; the store keeps every one, under audit/."""
    try:
        start = _since(since) if since else None
    except ValueError as exc:
        raise _refuse(exc)
    entries = _client().audit(start, user, limit)
    if not entries:
        typer.echo("no audit entries" + (" in that time" if since else "") + (f" of {user}" if user else ""))
    for entry in entries:
        typer.echo(entry.line())
