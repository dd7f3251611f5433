"""``JobClient``'s surface through the pool's server (``baton server``): what a user with ``BATON_SERVER_URL``
and a token (``BATON_TOKEN``, or ``~/.config/baton/token``) gets from ``JobClient()`` and every client
command. It holds no Redis or store credentials: each call is one HTTPS request that the server checks
against the user's role, over urllib3 (already there: boto3's).

Shipped code is packed here and uploaded under its digest (``server_code``). What it does not do:
``recover`` (the operator's, in direct mode: it reads the store)."""
from __future__ import annotations

import builtins
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import urllib3

from baton.jobs.pool import check_quota
from baton.jobs.server_job import ServerJob
from baton.jobs.server_views import as_status, queue_view, search_results, sweep_entries
from baton.jobs.specfile import SpecSource, read_raw
from baton.schemas.errors import BatonError, JobNotFound, OverLimit, ServerError, SpecError
from baton.schemas.overrides import Overrides, normalize, normalize_grid
from baton.schemas.settings import BatonSettings
from baton.schemas.status import JobStatus

TOKEN_FILE = Path("~/.config/baton/token")
TIMEOUT_S = 30.0


def _token(settings: BatonSettings) -> str:
    given = settings.token.get_secret_value()
    if given:
        return given.strip()
    path = TOKEN_FILE.expanduser()
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        raise ServerError(401, f"BATON_SERVER_URL is set but no token is: set BATON_TOKEN or write it to {path}") from None


IDEMPOTENT = frozenset({"GET", "PUT", "DELETE"})


def _connections(url: str) -> urllib3.PoolManager:
    """Kept-alive connections to the server, through the proxy the environment names for it (HTTPS_PROXY,
    NO_PROXY: as ``urllib`` reads them); nothing retried here (``ServerClient.call`` says what is)."""
    retries = False
    parts = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        return urllib3.ProxyManager(proxy, retries=retries)
    return urllib3.PoolManager(retries=retries)


class ServerClient:
    """The client of the pool's server: ``submit``, ``job``, ``list``, and ``Job`` handles over HTTP."""

    def __init__(self, settings: BatonSettings):
        self.settings = settings
        self.url = settings.server_url
        self._token = _token(settings)
        self._http = _connections(self.url)

    def call(self, method: str, path: str, body: Any = None, raw: bool = False, data: Optional[bytes] = None,
             timeout_s: float = TIMEOUT_S) -> Any:
        """The server's answer to one request (JSON, or bytes with ``raw``) with a JSON ``body`` or the bytes
        ``data``; ServerError, JobNotFound or SpecError (422 with problems) when it says no. Connections are
        kept open between calls; a request that may have reached the server is never sent twice unless it
        is idempotent (a submit is not), and no redirect is followed (the token goes to this server only)."""
        content_type = "application/json" if data is None else "application/octet-stream"
        if data is None and body is not None:
            data = json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": content_type, "Accept": "application/json"}
        try:
            try:
                response = self._http.request(method, self.url + path, body=data, timeout=timeout_s, redirect=False,
                                              headers=headers)
            except urllib3.exceptions.ProtocolError:  # a kept-alive connection the server closed meanwhile
                if method not in IDEMPOTENT:
                    raise
                response = self._http.request(method, self.url + path, body=data, timeout=timeout_s, redirect=False,
                                              headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            reason = str(getattr(exc, "reason", None) or exc)
            reason = reason.split(">: ", 1)[-1] if reason.startswith("<") else reason  # (not the connection's repr)
            raise ServerError(0, f"error: cannot reach the pool's server at {self.url}: {reason}; check "
                              "BATON_SERVER_URL") from None
        if response.status >= 300:
            raise _refusal(response.status, response.data)
        return response.data if raw else json.loads(response.data or b"null")

    def whoami(self) -> dict:
        return self.call("GET", "/api/whoami")

    def _queued(self, spec: SpecSource, overrides: Overrides, code: "str | Path | None",
                point: Optional[dict] = None) -> tuple[dict, dict]:
        """The spec's mapping and its overrides as the server takes them: its code shipped (``server_code``)."""
        from baton.jobs.server_code import ship

        raw = read_raw(spec)
        if not isinstance(raw, dict):
            raise SpecError(["spec: must be a mapping of sections"])
        return ship(self, raw, normalize(overrides), code, point)

    def submit(self, spec: SpecSource, job_id: Optional[str] = None, overrides: Overrides = None,
               code: "str | Path | None" = None, pause_at: Optional[int] = None) -> "ServerJob":
        """As ``JobClient.submit``: the spec is read here (a file of yours, or a mapping), its code packed and
        uploaded, and validated by the server, for you; SpecError (nothing queued) naming each wrong field,
        ServerError when your role may not submit to its team or its priority is above the team's limit."""
        raw, wanted = self._queued(spec, overrides, code)
        answer = self.call("POST", "/api/jobs", _given({"spec": raw, "id": job_id, "overrides": wanted or None,
                                                        "pause_at": pause_at}))
        return ServerJob(self, answer["id"])

    def validate(self, spec: SpecSource, overrides: Overrides = None) -> None:
        """SpecError naming every problem the server finds in the spec (the modules it allows among them);
        nothing is queued or stored."""
        raw = read_raw(spec)
        if not isinstance(raw, dict):
            raise SpecError(["spec: must be a mapping of sections"])
        self.call("POST", "/api/validate", _given({"spec": raw, "overrides": normalize(overrides) or None}))

    def sweep(self, spec: SpecSource, grid: "Mapping[str, Sequence[Any]] | Sequence[str]",
              overrides: Overrides = None, sweep_id: Optional[str] = None, code: "str | Path | None" = None) -> Any:
        """As ``JobClient.sweep``: one job per point of ``grid``, every point validated by the server first."""
        from baton.jobs.client import Sweep

        axes = normalize_grid(grid)
        raw, wanted = self._queued(spec, overrides, code, {path: values[0] for path, values in axes.items()})
        answer = self.call("POST", "/api/sweeps", _given({"spec": raw, "grid": axes, "overrides": wanted or None,
                                                          "id": sweep_id}))
        return Sweep(answer["id"], [ServerJob(self, job_id) for job_id in answer["jobs"]])

    def search(self, spec: SpecSource, search: "str | Path | dict", overrides: Overrides = None,
               search_id: Optional[str] = None, code: "str | Path | None" = None) -> Any:
        """As ``JobClient.search``: the search file is read and checked here, the search run by the server."""
        from baton.jobs.client import Sweep
        from baton.jobs.search_submit import read_search

        found = read_search(search).model_dump(mode="json", by_alias=True, exclude_none=True)
        raw, wanted = self._queued(spec, overrides, code)
        answer = self.call("POST", "/api/searches", _given({"spec": raw, "search": found, "overrides": wanted or None,
                                                            "id": search_id}))
        return Sweep(answer["id"], [ServerJob(self, job_id) for job_id in answer["jobs"]])

    def _sweep(self, sweep_id: str) -> dict:
        return self.call("GET", f"/api/sweeps/{_quoted(sweep_id)}")

    def sweep_results(self, sweep_id: str) -> Any:
        answer = self._sweep(sweep_id)
        return sweep_entries(answer) if answer["kind"] == "sweep" else search_results(answer["results"])

    def search_results(self, search_id: str) -> Any:
        answer = self._sweep(search_id)
        if answer["kind"] != "search":
            raise JobNotFound(f"no search {search_id!r}; {search_id!r} is a grid sweep: baton list --sweep {search_id}")
        return search_results(answer["results"])

    def search_report(self, search_id: str, dest: "str | Path") -> "builtins.list[Path]":
        from baton.searches.report import write_report

        return write_report(self.search_results(search_id), dest)

    def cancel_sweep(self, sweep_id: str) -> dict[str, str]:
        return self.call("POST", f"/api/sweeps/{_quoted(sweep_id)}/cancel")["answers"]

    def job(self, job_id: str) -> "ServerJob":
        job = ServerJob(self, job_id)
        job.status()  # JobNotFound, or a refusal, now
        return job

    def __getattr__(self, name: str) -> Any:
        if name in UNSUPPORTED:
            raise _unsupported(name)
        raise AttributeError(name)

    def principals(self) -> "ServerPrincipals":
        return ServerPrincipals(self)

    def set_max_priority(self, team: str, limit: Optional[int]) -> None:
        check_quota("default", team)  # (the team's name, checked as direct mode checks it)
        try:
            self.call("PUT", f"/api/teams/{_quoted(team)}", {"max_priority": limit})
        except ServerError as exc:
            if exc.status == 422:
                raise ValueError(exc.detail) from None
            raise

    def limits(self) -> dict[str, int]:
        return self.call("GET", "/api/teams")["teams"]

    def audit(self, since: Optional[float], user: Optional[str], limit: int) -> list:
        from baton.schemas.audit import AuditEntry

        query = urllib.parse.urlencode({k: v for k, v in (("since", since), ("user", user), ("limit", limit)) if v is not None})
        return [AuditEntry.model_validate(e) for e in self.call("GET", f"/api/audit?{query}")["entries"]]

    def list(self, limit: int = 100) -> list[JobStatus]:
        """The newest jobs of your teams first (an admin's: every team's)."""
        rows = self.call("GET", f"/api/jobs?limit={int(limit)}")["jobs"]
        return [as_status(row) for row in rows if row.get("state") != "stored"]

    def _queues(self, name: Optional[str] = None) -> dict:
        return self.call("GET", "/api/queue" + (f"?name={urllib.parse.quote(name)}" if name is not None else ""))

    def queue(self, name: Optional[str] = None) -> "builtins.list[Any]":
        """As ``JobClient.queue``: every user sees every queue's line (ids, teams, reasons)."""
        answer = self._queues(name)
        return [queue_view(view, answer["quotas"]) for view in answer["queues"]]

    def quotas(self) -> dict[str, dict[str, int]]:
        return self._queues()["quotas"]

    def usage(self, queue: str) -> dict[str, int]:
        views = self._queues(queue)["queues"]
        return views[0]["usage"] if views else {}

    def live_workers(self, queue: str) -> "builtins.list[str]":
        views = self._queues(queue)["queues"]
        return views[0]["workers"] if views else []

    def set_quota(self, team: str, queue: str, slots: int) -> "builtins.list[str]":
        """As ``JobClient.set_quota`` (an admin's token); ValueError for a team or queue name that cannot be."""
        check_quota(queue, team, slots)
        try:
            return self.call("PUT", f"/api/quotas/{_quoted(queue)}/{_quoted(team)}", {"slots": slots})["warnings"]
        except ServerError as exc:
            if exc.status == 422:
                raise ValueError(exc.detail) from None
            raise

    def remove_quota(self, team: str, queue: str) -> bool:
        check_quota(queue, team)
        try:
            self.call("DELETE", f"/api/quotas/{_quoted(queue)}/{_quoted(team)}")
        except JobNotFound:
            return False
        except ServerError as exc:
            if exc.status == 422:
                raise ValueError(exc.detail) from None
            raise
        return True

    def _drain(self, worker: str, drained: bool) -> tuple[str, bool]:
        try:
            answer = self.call("POST", f"/api/workers/{_quoted(worker)}/drain", {"drained": drained})
        except JobNotFound as exc:
            raise ValueError(str(exc)) from None
        return answer["worker"], answer["changed"]

    def drain(self, worker: str) -> tuple[str, bool]:
        return self._drain(worker, True)

    def undrain(self, worker: str) -> tuple[str, bool]:
        return self._drain(worker, False)


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _given(body: dict) -> dict:
    return {key: value for key, value in body.items() if value is not None}


UNSUPPORTED = frozenset({"recover", "search_driver"})


def _unsupported(name: str) -> ServerError:
    return ServerError(400, f"error: {name} is not done through the pool's server: the operator does it in direct "
                       "mode (BATON_SERVER_URL unset, with the pool's Redis and store)")


class ServerPrincipals:
    """``baton users`` through the server (an admin's token): ``storage.records.principals.Principals``'s calls."""

    def __init__(self, client: ServerClient):
        self.client = client

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        from baton.storage.records.principals import PrincipalError

        try:
            return self.client.call(method, path, body)
        except (ServerError, JobNotFound) as exc:
            if isinstance(exc, JobNotFound) or exc.status in (404, 409, 422):
                raise PrincipalError(getattr(exc, "detail", str(exc))) from None
            raise

    def add(self, principal: Any) -> str:
        return self._call("POST", "/api/users", {"name": principal.name, "role": principal.role.value,
                                                 "teams": list(principal.teams), "service": principal.service})["token"]

    def list(self) -> list:
        from baton.schemas.principals import Principal

        return [Principal.model_validate(p) for p in self._call("GET", "/api/users")["users"]]

    def remove(self, name: str) -> None:
        self._call("DELETE", f"/api/users/{_quoted(name)}")

    def rotate(self, name: str) -> str:
        return self._call("POST", f"/api/users/{_quoted(name)}/token")["token"]


def _refusal(status: int, content: bytes) -> BatonError:
    try:
        detail = json.loads(content).get("detail")
    except (ValueError, AttributeError):
        detail = None
    if status in (403, 422) and isinstance(detail, dict) and "problems" in detail:
        return (OverLimit if status == 403 else SpecError)(list(detail["problems"]), str(detail.get("what") or "job spec"))
    line = detail if isinstance(detail, str) else f"HTTP {status}"
    if status == 404:
        return JobNotFound(line)
    return ServerError(status, f"error: the pool's server refused ({status}): {line}", line)


def server_settings() -> Optional[BatonSettings]:
    """The settings, when they name a server (``BATON_SERVER_URL``); None otherwise (direct mode)."""
    if not os.environ.get("BATON_SERVER_URL"):
        return None
    settings = BatonSettings()
    return settings if settings.server_url else None
