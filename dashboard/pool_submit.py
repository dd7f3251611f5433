"""What users queue through the pool's server (``baton server``): a job, a grid sweep, a search, and the code
they ship with them, each for the signed-in principal (``JobClient.acting_for``: a team the principal may not
submit to, or a priority above the team's limit, is refused before anything is stored); a sweep's or a
search's results, and cancelling one. A spec comes as a mapping, never a path of the server's: code comes as
an archive the client packed (``PUT /api/code/DIGEST``), stored under its sha256 as ``baton submit --code``
stores it."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import re
from typing import TYPE_CHECKING, Any, Callable, Optional

from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from baton.jobs.code_ship import not_the_servers
from baton.jobs.roles import may_act, may_read
from baton.jobs.specfile import with_overrides
from baton.schemas.code import DIGEST_PATTERN
from baton.schemas.errors import JobNotFound, OverLimit, PreconditionFailed, SpecError
from baton.schemas.overrides import normalize
from baton.schemas.principals import Principal
from baton.schemas.spec import JobSpec
from baton.storage.layout import code_key
from baton.storage.records import searches

if TYPE_CHECKING:
    from baton.dashboard.app import Context


def _with_team(raw: Any, who: Principal) -> Any:
    """A spec that names no team is its submitter's first team's (an admin of no team: ``default``)."""
    if not isinstance(raw, dict) or not who.teams:
        return raw
    resources = raw.get("resources")
    if resources is None:
        return {**raw, "resources": {"team": who.teams[0]}}
    if isinstance(resources, dict) and "team" not in resources:
        return {**raw, "resources": {**resources, "team": who.teams[0]}}
    return raw


def _no_local_code(raw: Any) -> None:
    """Before a spec's targets are checked with its code.dir on the import path (the server's directory)."""
    code = raw.get("code") if isinstance(raw, dict) else None
    if isinstance(code, dict) and code.get("dir") is not None:
        raise SpecError([not_the_servers("code.dir")])


@dataclasses.dataclass(frozen=True)
class Queued:
    """A submit's body, checked: the spec (a mapping, the submitter's team filled in), its overrides, an id."""

    raw: dict
    overrides: Any
    given_id: Optional[str]
    body: dict


def _queued(body: dict, who: Principal) -> Queued:
    given_id, overrides = body.get("id"), body.get("overrides")
    if given_id is not None and not isinstance(given_id, str):
        raise HTTPException(422, "id must be a string")
    if overrides is not None and not (isinstance(overrides, dict) or isinstance(overrides, list)
                                      and all(isinstance(item, str) for item in overrides)):
        raise HTTPException(422, "overrides must be a mapping or a list of path=value")
    if not isinstance(body.get("spec"), dict):
        raise HTTPException(422, "spec must be a mapping (the spec file's contents)")  # never a path of the server's
    return Queued(_with_team(body["spec"], who), overrides, given_id, body)


async def _queue(request: Request, ctx: "Context", act: Callable[[Queued, Any], Any]) -> Any:
    """``act(queued, client)`` for the request's principal, its refusals as the API says them: 403 for a policy
    (a team, a limit), 422 naming every wrong field."""
    from baton.dashboard.app import small_json

    who = await run_in_threadpool(ctx.access.actor, request)
    queued = _queued(await small_json(request), who)
    request.state.target = queued.given_id or f"name={str(queued.raw.get('name', ''))[:64]}"

    def run() -> Any:
        _no_local_code(with_overrides(queued.raw, normalize(queued.overrides)))
        return act(queued, ctx.client.acting_for(who))

    try:
        return await run_in_threadpool(run)
    except OverLimit as exc:  # (a policy's refusal: 403, its problems as a spec's, which a client says the same way)
        raise HTTPException(403, {"problems": list(exc.problems), "message": str(exc), "policy": True})
    except SpecError as exc:
        raise HTTPException(422, {"problems": list(exc.problems), "message": str(exc), "what": exc.what})


def add_routes(app: FastAPI, ctx: "Context") -> None:
    _submit_routes(app, ctx)
    _code_routes(app, ctx)
    _sweep_routes(app, ctx)


def _submit_routes(app: FastAPI, ctx: "Context") -> None:
    @app.post("/api/jobs", name="submit")
    async def submit(request: Request) -> dict:
        def act(queued: Queued, client: Any) -> dict:
            pause_at = queued.body.get("pause_at")
            if pause_at is not None and (isinstance(pause_at, bool) or not isinstance(pause_at, int)):
                raise SpecError(["pause_at: must be an integer"])
            request.state.target = client.submit(queued.raw, queued.given_id, queued.overrides, pause_at=pause_at).id
            return {"id": request.state.target}

        return await _queue(request, ctx, act)

    @app.post("/api/validate", name="validate")
    async def validate(request: Request) -> dict:
        """The spec checked as a submit checks it (this server's allowed modules, its code.dir refused), nothing
        queued or stored."""
        from baton.jobs.specfile import load_spec

        def act(queued: Queued, client: Any) -> dict:
            return {"name": load_spec(queued.raw, client.settings.allowed_prefixes, queued.overrides).name}

        return await _queue(request, ctx, act)

    @app.post("/api/sweeps", name="sweep")
    async def sweep(request: Request) -> dict:
        def act(queued: Queued, client: Any) -> dict:
            grid = queued.body.get("grid")
            if not (isinstance(grid, dict) or isinstance(grid, list) and all(isinstance(g, str) for g in grid)):
                raise SpecError(["grid: must be a mapping of path to values, or a list of path=v1,v2"])
            made = client.sweep(queued.raw, grid, queued.overrides, queued.given_id)
            request.state.target = made.id
            return {"id": made.id, "jobs": [job.id for job in made.jobs]}

        return await _queue(request, ctx, act)

    @app.post("/api/searches", name="search")
    async def search(request: Request) -> dict:
        def act(queued: Queued, client: Any) -> dict:
            found = queued.body.get("search")
            if not isinstance(found, dict):
                raise SpecError(["search: must be a mapping (the search file's contents)"], "search")
            made = client.search(queued.raw, found, queued.overrides, queued.given_id)
            request.state.target = made.id
            return {"id": made.id, "jobs": [job.id for job in made.jobs]}

        return await _queue(request, ctx, act)


def _check_digest(digest: str) -> None:
    if not re.fullmatch(DIGEST_PATTERN, digest):  # (fullmatch: a trailing newline is refused too)
        raise HTTPException(422, "the digest must be sha256:<64 hex digits>")


def _code_routes(app: FastAPI, ctx: "Context") -> None:
    @app.get("/api/code/{digest}", name="code.exists")
    def code_exists(digest: str, request: Request) -> dict:
        """Whether the store holds this archive (a client packs first, and uploads only what is missing)."""
        ctx.access.actor(request)
        _check_digest(digest)
        return {"digest": digest, "exists": ctx.store().exists(code_key(digest))}

    @app.put("/api/code/{digest}", name="code.put")
    async def code_put(digest: str, request: Request) -> dict:
        """Store an archive of code under its digest, once: the body must hash to it (a client cannot store
        bytes under another archive's name), and an archive already stored is kept as it is."""
        from baton.dashboard.app import body_limit

        await run_in_threadpool(ctx.access.actor, request)
        request.state.target = digest
        _check_digest(digest)
        limit, data = body_limit(request), bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise HTTPException(413, f"an archive of code holds at most {limit} bytes (BATON_CODE_LIMIT_MB on "
                                    "the server)")
        found = f"sha256:{hashlib.sha256(data).hexdigest()}"
        if found != digest:
            raise HTTPException(422, f"the body's digest is {found}, not {digest}")
        if not data.startswith(b"\x1f\x8b"):  # (a worker unpacks it only after its own checks: this refuses a slip)
            raise HTTPException(422, "an archive of code is a gzip'd tar (what `baton submit --code` packs)")

        def keep() -> bool:
            store, key = ctx.store(), code_key(digest)
            if store.exists(key):
                return False
            with contextlib.suppress(PreconditionFailed):  # (stored meanwhile by another upload: the same bytes)
                store.put_if(key, bytes(data), None)
            return True

        return {"digest": digest, "stored": await run_in_threadpool(keep)}


def _sweep_of(ctx: "Context", sweep_id: str) -> list[tuple[str, str, str]]:
    """Who owns a sweep: each of its jobs as (job id, team, submitted by); for a search, the search itself (its
    trials are its own: a search space holds no team). JobNotFound for an unknown id."""
    records = ctx.records
    if searches.exists(records.redis, sweep_id):
        meta = searches.meta(records.redis, sweep_id)
        return [(sweep_id, JobSpec.model_validate_json(meta["spec"]).resources.team, meta.get("submitted_by", ""))]
    found = []
    for job_id in records.sweep_ids(sweep_id):
        try:
            status = records.status(job_id)
        except JobNotFound:
            continue
        found.append((job_id, status.team, status.submitted_by or ""))
    if not found:
        raise JobNotFound(f"no sweep or search {sweep_id!r}")
    return found


def _sweep_routes(app: FastAPI, ctx: "Context") -> None:
    clean = ctx.access.clean

    @app.get("/api/sweeps/{sweep_id}", name="sweep.read")
    def sweep_results(sweep_id: str, request: Request) -> dict:
        """A grid sweep's jobs, best first, or a search's results (its trials, rungs, best)."""
        who = ctx.access.reader(request)
        for _, team, _ in _sweep_of(ctx, sweep_id):
            ctx.access.require(request, may_read(who, team))
        found = ctx.client.sweep_results(sweep_id)
        if isinstance(found, list):
            return clean({"kind": "sweep", "entries": [{"status": entry.status.model_dump(mode="json"),
                                                        "monitor": entry.monitor, "mode": entry.mode} for entry in found]})
        results = {field.name: getattr(found, field.name) for field in dataclasses.fields(found)}
        results["trials"] = [{**{field.name: getattr(trial, field.name) for field in dataclasses.fields(trial)},
                              "status": trial.status.model_dump(mode="json")} for trial in found.trials]
        return clean({"kind": "search", "results": results})

    @app.post("/api/sweeps/{sweep_id}/cancel", name="sweep.cancel")
    def sweep_cancel(sweep_id: str, request: Request) -> dict:
        """Cancel every job of it (a search: and its next rounds), or nothing when the principal may not
        cancel one of them (a member: only a sweep of its own)."""
        who = ctx.access.actor(request)
        request.state.target = sweep_id
        for _, team, submitted_by in _sweep_of(ctx, sweep_id):
            ctx.access.require(request, may_act(who, "cancel", team, submitted_by))
        return clean({"id": sweep_id, "answers": ctx.client.cancel_sweep(sweep_id)})
