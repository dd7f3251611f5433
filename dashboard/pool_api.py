"""The pool server's own routes (``baton server``; not ``baton ui``): who am I, a job's status, history and
files for clients, and the admin's: quotas, team limits, users, the audit trail (what users queue:
``pool_submit``). Each checks the role table (``baton.jobs.roles``) before it acts."""
from __future__ import annotations

import dataclasses
import io
import tarfile
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from baton.jobs.downloads import download
from baton.schemas.principals import Principal, Role
from baton.storage.records import events
from baton.storage.records.principals import PrincipalError

if TYPE_CHECKING:
    from baton.dashboard.app import Context


def add_routes(app: FastAPI, ctx: "Context") -> None:
    from baton.dashboard import pool_submit

    pool_submit.add_routes(app, ctx)
    _job_routes(app, ctx)
    _fetch_route(app, ctx)
    _pool_routes(app, ctx)
    _user_routes(app, ctx)


def _job_routes(app: FastAPI, ctx: "Context") -> None:
    clean = ctx.access.clean

    @app.get("/api/whoami", name="whoami")
    def whoami(request: Request) -> dict:
        return ctx.access.reader(request).model_dump(mode="json")

    @app.get("/api/jobs/{job_id}/status", name="status")
    def status(job_id: str, request: Request) -> dict:
        found = ctx.readable(request, job_id)
        if found.status is None:
            raise HTTPException(404, f"no job {job_id!r} in Redis (the store holds it: read it with --storage)")
        return clean(found.status.model_dump(mode="json"))

    @app.get("/api/jobs/{job_id}/events", name="events")
    def job_events(job_id: str, request: Request) -> dict:
        ctx.readable(request, job_id)
        return clean({"events": [dataclasses.asdict(event) for event in events.events(ctx.records.redis, job_id)]})



def _fetch_route(app: FastAPI, ctx: "Context") -> None:
    clean = ctx.access.clean

    @app.get("/api/jobs/{job_id}/fetch/{which}", name="fetch")
    def fetch(job_id: str, which: str, request: Request) -> Response:
        """What ``baton fetch --which WHICH`` writes (best, latest, final, tensorboard, code), each file verified
        against its manifest's sha256 here, as one tar archive of the job's folder."""
        found = ctx.readable(request, job_id)
        if found.elsewhere:
            raise HTTPException(404, f"job {job_id} is stored in a store this server does not read")
        with tempfile.TemporaryDirectory(prefix="baton-fetch-") as scratch:
            try:
                path = download(found.store, job_id, scratch, which)
            except (FileNotFoundError, ValueError) as exc:
                raise HTTPException(404, clean(str(exc)))
            archive = io.BytesIO()
            with tarfile.open(fileobj=archive, mode="w") as tar:
                tar.add(path, arcname=str(Path(path).relative_to(scratch)))
        return Response(archive.getvalue(), media_type="application/x-tar")


def _pool_routes(app: FastAPI, ctx: "Context") -> None:
    from baton.dashboard.app import small_json

    @app.put("/api/quotas/{queue}/{team}", name="quota.set")
    async def quota_set(queue: str, team: str, request: Request) -> dict:
        await run_in_threadpool(ctx.pool_action, request, "quota")
        slots = (await small_json(request)).get("slots")
        if isinstance(slots, bool) or not isinstance(slots, int):
            raise HTTPException(422, "slots must be an integer")
        try:
            warnings = await run_in_threadpool(ctx.client.set_quota, team, queue, slots)
        except ValueError as exc:
            raise HTTPException(422, str(exc))
        return {"queue": queue, "team": team, "slots": slots, "warnings": warnings}

    @app.delete("/api/quotas/{queue}/{team}", name="quota.rm")
    def quota_rm(queue: str, team: str, request: Request) -> dict:
        ctx.pool_action(request, "quota")
        try:
            removed = ctx.client.remove_quota(team, queue)
        except ValueError as exc:
            raise HTTPException(422, str(exc))
        if not removed:
            raise HTTPException(404, f"team {team} has no quota on queue {queue}")
        return {"queue": queue, "team": team, "removed": True}

    @app.put("/api/teams/{team}", name="teams.set")
    async def team_set(team: str, request: Request) -> dict:
        await run_in_threadpool(ctx.pool_action, request, "teams")
        limit = (await small_json(request)).get("max_priority")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise HTTPException(422, "max_priority must be an integer or null")
        try:
            await run_in_threadpool(ctx.client.set_max_priority, team, limit)
        except ValueError as exc:
            raise HTTPException(422, str(exc))
        return {"team": team, "max_priority": limit}

    @app.get("/api/teams", name="teams.list")
    def team_list(request: Request) -> dict:
        ctx.access.reader(request)  # (a limit is what a user must know to submit under it)
        return {"teams": ctx.client.limits()}



def _user_routes(app: FastAPI, ctx: "Context") -> None:
    from baton.dashboard.app import small_json

    @app.get("/api/users", name="users.list")
    def users(request: Request) -> dict:
        ctx.pool_action(request, "users")
        return {"users": [p.model_dump(mode="json") for p in ctx.access.principals.list()]}  # type: ignore[union-attr]

    @app.post("/api/users", name="users.add")
    async def user_add(request: Request) -> dict:
        await run_in_threadpool(ctx.pool_action, request, "users")
        body = await small_json(request)
        request.state.target = str(body.get("name", ""))[:64]
        if not isinstance(body.get("teams", []), list) or not isinstance(body.get("service", False), bool):
            raise HTTPException(422, "teams must be a list of names and service true or false")
        try:
            who = Principal(name=body.get("name"), role=body.get("role", "member"), teams=tuple(body.get("teams") or ()),
                            service=bool(body.get("service", False)))
        except (ValidationError, TypeError) as exc:
            raise HTTPException(422, str(exc).splitlines()[0] if isinstance(exc, TypeError) else
                                "; ".join(f"{'.'.join(map(str, e['loc'])) or 'user'}: {e['msg']}"
                                          for e in exc.errors(include_url=False)))
        if who.role is not Role.admin and not who.teams:
            raise HTTPException(422, f"a {who.role.value} needs a team: it submits to and reads only its teams")
        try:
            token = await run_in_threadpool(ctx.access.principals.add, who)  # type: ignore[union-attr]
        except PrincipalError as exc:
            raise HTTPException(409, str(exc))
        return {"name": who.name, "token": token}

    @app.delete("/api/users/{name}", name="users.rm")
    def user_rm(name: str, request: Request) -> dict:
        ctx.pool_action(request, "users")
        try:
            ctx.access.principals.remove(name)  # type: ignore[union-attr]
        except PrincipalError as exc:
            raise HTTPException(404, str(exc))
        return {"name": name, "removed": True}

    @app.post("/api/users/{name}/token", name="users.rotate")
    def user_rotate(name: str, request: Request) -> dict:
        ctx.pool_action(request, "users")
        try:
            return {"name": name, "token": ctx.access.principals.rotate(name)}  # type: ignore[union-attr]
        except PrincipalError as exc:
            raise HTTPException(404, str(exc))

    @app.get("/api/audit", name="audit")
    def audit_trail(request: Request, since: Optional[float] = None, user: Optional[str] = None,
                    limit: int = 1000) -> dict:
        ctx.pool_action(request, "audit")
        found = ctx.client.audit(since, user, max(1, min(limit, 10_000)))
        return {"entries": [entry.model_dump(mode="json") for entry in found], "now": time.time()}
