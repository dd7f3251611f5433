"""``baton ui``: the web dashboard, served from this machine over the workers' Redis and store."""
from __future__ import annotations

import ipaddress
import socket
from typing import List, Optional

import typer

from baton.commands.common import _say_which_redis, _settings, app

LOOPBACK_NAMES = ("localhost",)


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying why not (a port in use, an address not on this machine)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
        return sock
    except OSError as exc:
        typer.echo(f"baton ui: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2)


@app.command()
def ui(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anyone who can reach it can read "
                             "every job; keep the default (this machine only) unless a proxy guards it."),
    port: int = typer.Option(8265, "--port", min=0, max=65535, help="Port to listen on."),
    allowed_host: Optional[List[str]] = typer.Option(None, "--allowed-host", help="A host name the dashboard's URL "
                                                     "may use (repeatable); other Host headers are refused. Default: "
                                                     "the loopback names when --host is loopback, any otherwise."),
    history_every_s: float = typer.Option(30.0, "--history-every-s", min=0.1, help="How often the store is listed "
                                          "for jobs Redis does not hold (`baton run` jobs, records Redis lost)."),
) -> None:
    """Serve the web dashboard: jobs, a job's live curves and attempts, the queue, the workers.
    Actions (cancel, resume, priority, drain) need BATON_UI_TOKEN; without it the dashboard is read-only."""
    import uvicorn

    from baton.dashboard.access import LOOPBACK_HOSTS
    from baton.dashboard.app import make_app

    _say_which_redis()
    settings = _settings()
    token = settings.ui_token.get_secret_value() or None
    hosts = [h.lower() for h in allowed_host] if allowed_host else (
        [*LOOPBACK_HOSTS, host.lower()] if _is_loopback(host) else ["*"])
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"baton ui: serving http://{shown}:{bound_port} "
               f"({'actions need BATON_UI_TOKEN' if token else 'read-only: set BATON_UI_TOKEN to allow actions'})",
               err=True)
    if not _is_loopback(host):
        typer.echo(f"baton ui: listening on {host}: whoever can reach it can read every job's page", err=True)
    config = uvicorn.Config(make_app(settings, token, hosts, history_every_s), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
