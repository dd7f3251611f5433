"""``baton ui`` (the web dashboard for one trusted person) and ``baton server`` (the pool's control plane:
the same pages and a JSON API, every request naming its user by a token), both over the workers' Redis
and store."""
from __future__ import annotations

import ipaddress
import os
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


def _bind(host: str, port: int, command: str = "baton ui") -> socket.socket:
    """The listening socket, or one line saying why not (a port in use, an address not on this machine)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
        # (named TCP, as asyncio needs to set TCP_NODELAY on each connection: without it, a kept-alive
        # connection waits ~40 ms on every response, Nagle's algorithm against the client's delayed ACK)
        sock = socket.socket(info[0], socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
        return sock
    except OSError as exc:
        typer.echo(f"{command}: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
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
    _serve(make_app(settings, token, hosts, history_every_s), sock, None, None)


def _serve(app, sock, certfile: Optional[str], keyfile: Optional[str], proxies: Optional[str] = None) -> None:
    """``proxies``: the addresses whose X-Forwarded-For / -Proto are believed (None: nobody's, so a client
    cannot name another address for itself in the audit trail)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, ssl_certfile=certfile, ssl_keyfile=keyfile,
                            proxy_headers=proxies is not None, forwarded_allow_ips=proxies)
    uvicorn.Server(config).run(sockets=[sock])


def _bootstrap_admin(settings, name: str) -> None:
    """Make the first admin ``name`` and print its token once; say so when ``name`` exists already."""
    from baton.jobs.client import JobClient
    from baton.schemas.principals import Principal, Role
    from baton.storage.records.principals import PrincipalError, Principals

    principals = Principals(JobClient(settings.redis_url, settings.storage_url).records.redis)
    try:
        who = Principal(name=name, role=Role.admin)
    except ValueError:
        typer.echo(f"--bootstrap-admin: {name!r} is not a user's name (lower case letters, digits, '.', '_', '-')", err=True)
        raise typer.Exit(2)
    try:
        token = principals.add(who)
    except PrincipalError:
        typer.echo(f"baton server: user {name} exists already (its token was shown when it was made; "
                   f"`baton users token {name} --rotate` makes a new one)", err=True)
        return
    typer.echo(token)
    typer.echo(f"baton server: made admin {name}; its token above is shown once (stored only as a hash)", err=True)


@app.command()
def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; use TLS or "
                             "a reverse proxy that terminates it where the network is not yours)."),
    port: int = typer.Option(8470, "--port", min=0, max=65535, help="Port to listen on."),
    certfile: Optional[str] = typer.Option(None, "--certfile", help="TLS certificate (PEM): serve https."),
    keyfile: Optional[str] = typer.Option(None, "--keyfile", help="TLS private key (PEM) of --certfile."),
    allowed_host: Optional[List[str]] = typer.Option(None, "--allowed-host", help="A host name the server's URL "
                                                     "may use (repeatable); other Host headers are refused. Default: "
                                                     "the loopback names when --host is loopback, any otherwise."),
    bootstrap_admin: Optional[str] = typer.Option(None, "--bootstrap-admin", help="Make this admin first (when no "
                                                  "user has the name) and print its token once."),
    history_every_s: float = typer.Option(30.0, "--history-every-s", min=0.1, help="How often the store is listed "
                                          "for jobs Redis does not hold."),
    forwarded_allow_ips: Optional[str] = typer.Option(None, "--forwarded-allow-ips", help="Behind a reverse proxy: "
                                                      "its addresses (comma-separated), whose X-Forwarded-For names the "
                                                      "client in the audit trail. Default: no one's is believed."),
) -> None:
    """Serve the pool: the JSON API that clients with BATON_SERVER_URL and a token use, and the dashboard's
    pages. Every request but GET /api/health names its user by a token (`baton users`); each may do what its
    role allows, and every action, allowed or refused, is written to the audit trail (`baton audit`)."""
    from baton.dashboard.access import LOOPBACK_HOSTS
    from baton.dashboard.app import make_app

    if (certfile is None) != (keyfile is None):
        typer.echo("baton server: give --certfile and --keyfile together", err=True)
        raise typer.Exit(2)
    for option, path in (("--certfile", certfile), ("--keyfile", keyfile)):
        if path is not None and not os.path.isfile(path):
            typer.echo(f"baton server: {option} {path}: no such file", err=True)
            raise typer.Exit(2)
    _say_which_redis()
    settings = _settings()
    if bootstrap_admin:
        _bootstrap_admin(settings, bootstrap_admin)
    hosts = [h.lower() for h in allowed_host] if allowed_host else (
        [*LOOPBACK_HOSTS, host.lower()] if _is_loopback(host) else ["*"])
    sock = _bind(host, port, "baton server")
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"baton server: serving {'https' if certfile else 'http'}://{shown}:{sock.getsockname()[1]} "
               "(every request needs a user's token)", err=True)
    if not certfile and not _is_loopback(host):
        typer.echo(f"baton server: listening on {host} without TLS: tokens cross the network in the clear unless "
                   "a proxy in front terminates TLS", err=True)
    _serve(make_app(settings, None, hosts, history_every_s, pool=True), sock, certfile, keyfile, forwarded_allow_ips)
