"""The dashboard's and the pool server's ASGI application: the pages (static files), the JSON API they
and the clients use, and who may do what (``access.py``, the role table ``baton.jobs.roles``).
``make_app`` builds it over a Redis and a default store; ``baton ui`` serves it for one person,
``baton server`` (with ``principals``) for the pool, its users named by their tokens and every action
written down (``audit_trail.py``)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any, AsyncIterator, Optional

import redis
from fastapi import Depends, FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from baton.jobs.client import JobClient
from baton.jobs.pool import drain, queue_views
from baton.schemas.errors import BatonError, JobNotFound
from baton.schemas.settings import BatonSettings
from baton.storage.artifacts import read_verified
from baton.storage.job_log import log_chunks
from baton.storage.records import events, presence
from baton.storage.layout import check_job_id
from baton.storage.records import keys
from baton.storage.stores.base import ObjectStore
from baton.storage.stores.open import open_client_store
from baton.dashboard import curves, job_view, listing
from baton.dashboard.access import Access
from baton.dashboard.audit_trail import AuditTrail, audited
from baton.jobs.roles import may_act, may_read, may_run_pool
from baton.schemas.principals import Principal, Role
from baton.storage.records.principals import Principals

STATIC = files("baton.dashboard") / "static"
PAGES = {"/": "jobs.html", "/queue": "queue.html", "/workers": "workers.html", "/audit": "audit.html"}
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
           "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
           "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-store"}


class Context:
    def __init__(self, settings: BatonSettings, access: Access, history_every_s: float, pool: bool = False):
        self.settings, self.access = settings, access
        self._store: Optional[ObjectStore] = None
        self.client = JobClient(settings.redis_url, settings.storage_url)
        self.records = self.client.records
        if pool:
            access.principals = Principals(self.records.redis)
        self.trail = AuditTrail(self.records.redis, self.store) if access.pool else None
        self.history = listing.StoreHistory(self.store, self.known_ids,
                                            history_every_s)
        self.metrics = curves.MetricsCache()
        self.rows = listing.RedisRows(self.records.redis)

    def store(self) -> ObjectStore:
        """The dashboard's own store (BATON_STORAGE_URL), opened once: the only one it reads."""
        if self._store is None:
            self._store = open_client_store(self.settings.storage_url)
        return self._store

    def known_ids(self) -> set[str]:
        return {str(job_id) for job_id in self.records.redis.zrange(keys.JOBS_INDEX, 0, -1)}

    def find(self, job_id: str) -> job_view.Found:
        try:
            check_job_id(job_id)
        except ValueError as exc:
            raise HTTPException(404, str(exc))
        return job_view.find(self.records, self.store(), self.settings.storage_url, job_id)

    def readable(self, request: Request, job_id: str) -> job_view.Found:
        """The job, if the request's principal may read it (401 or 403 otherwise; 404 if there is none)."""
        who = self.access.reader(request)
        found = self.find(job_id)
        self.access.require(request, may_read(who, job_view.team_of(found)[0]))
        return found

    def acted_on(self, request: Request, action: str, job_id: str) -> None:
        """401 or 403 unless the request's principal may ``action`` the job (404 if there is none)."""
        who = self.access.actor(request)
        team, submitted_by = job_view.team_of(self.find(job_id))
        self.access.require(request, may_act(who, action, team, submitted_by))

    def pool_action(self, request: Request, action: str) -> Principal:
        who = self.access.actor(request)
        self.access.require(request, may_run_pool(who, action))
        return who


def visible(who: Principal, rows: list[dict]) -> list[dict]:
    """The rows of the teams ``who`` may read (every row for an admin)."""
    if who.role is Role.admin:
        return rows
    return [row for row in rows if row.get("team") in who.teams]


def make_app(settings: BatonSettings, token: Optional[str], allowed_hosts: list[str],
             history_every_s: float = listing.STORE_LIST_EVERY_S, pool: bool = False) -> FastAPI:
    """The application; ``allowed_hosts``: the host names its URL may use (DNS rebinding is refused).
    ``pool``: the pool's server (principals' tokens, roles, the audit trail) rather than one person's
    dashboard (``token``: BATON_UI_TOKEN)."""
    ctx = Context(settings, Access(None if pool else token, allowed_hosts), history_every_s, pool)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.history.start()
        if ctx.trail is not None:
            ctx.trail.start()
        yield
        ctx.history.stop()
        if ctx.trail is not None:
            ctx.trail.stop()

    app = FastAPI(title="baton server" if pool else "baton dashboard", docs_url=None, redoc_url=None,
                  openapi_url=None if pool else "/api/openapi.json", lifespan=lifespan)
    app.state.ctx = ctx

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        started = time.time()
        refused = ctx.access.check_host(request)
        length = request.headers.get("content-length", "0")
        limit = body_limit(request)
        if refused:
            response: Response = JSONResponse({"detail": refused}, 421)
        elif not length.isdigit() or int(length) > limit:
            response = JSONResponse({"detail": f"this request's body holds at most {limit} bytes"}, 413)
        else:
            response = await call_next(request)
            if ctx.trail is not None and audited(request, response.status_code):
                response = await ctx.trail.record(request, response, started)
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(redis.RedisError)
    async def redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        return JSONResponse({"detail": ctx.access.clean(f"cannot reach Redis: {type(exc).__name__}: {exc}")}, 503)

    @app.exception_handler(BatonError)
    async def baton_error(request: Request, exc: BatonError) -> JSONResponse:
        code = 404 if isinstance(exc, JobNotFound) else 503
        return JSONResponse({"detail": ctx.access.clean(str(exc))}, code)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    _pages(app)
    _reads(app, ctx)
    _pool_reads(app, ctx)
    _actions(app, ctx)
    if pool:
        from baton.dashboard import pool_api

        pool_api.add_routes(app, ctx)
    return app


def _pages(app: FastAPI) -> None:
    for path, name in PAGES.items():
        app.add_api_route(path, lambda name=name: FileResponse(str(STATIC / name)), include_in_schema=False)
    app.add_api_route("/jobs/{job_id}", lambda job_id: FileResponse(str(STATIC / "job.html")), include_in_schema=False)


@dataclass
class ListParams:
    """The jobs listing's query: filters, the sort and the page."""

    state: Optional[str] = None
    team: Optional[str] = None
    queue: Optional[str] = None
    name: Optional[str] = None
    sort: str = "created_at"
    order: str = "desc"
    offset: int = 0
    limit: int = 50


def _reads(app: FastAPI, ctx: Context) -> None:
    clean = ctx.access.clean

    @app.get("/api/jobs", name="list")
    def jobs(request: Request, asked: ListParams = Depends()) -> dict:
        who = ctx.access.reader(request)
        rows = ctx.rows.rows()
        rows += ctx.history.rows({row["id"] for row in rows})
        if asked.sort not in listing.SORTABLE or asked.order not in ("asc", "desc"):
            raise HTTPException(422, f"sort must be one of {', '.join(listing.SORTABLE)}; order asc or desc")
        query = listing.Query(asked.state or None, asked.team or None, asked.queue or None, asked.name or None,
                              asked.sort, asked.order != "asc", asked.offset, asked.limit)
        return clean(listing.select(visible(who, rows), query))

    @app.get("/api/jobs/{job_id}", name="read")
    def job(job_id: str, request: Request) -> dict:
        return clean(job_view.detail(ctx.records, ctx.readable(request, job_id)))

    @app.get("/api/jobs/{job_id}/metrics", name="metrics")
    def metrics(job_id: str, request: Request, since: int = -1, max_rows: int = 0) -> Response:
        """The committed metrics rows past step ``since`` (as metrics.jsonl holds them; with ``max_rows``, an
        even sample of at most that many and the last), and the live points (step, loss, lr, time) the worker
        reported past the last of those rows."""
        found = ctx.readable(request, job_id)
        rows, last, total, stride = ctx.metrics.rows(found.store, job_id, found.manifest).after(since, max(0, max_rows))
        live = events.live_points(ctx.records.redis, job_id, max(last, since)) if found.status is not None else []
        body = (b'{"rows":' + rows + b',"total_rows":' + str(total).encode() + b',"stride":' + str(stride).encode()
                + b',"live":' + json.dumps(live).encode() + b"}")
        return Response(body, media_type="application/json")

    @app.get("/api/jobs/{job_id}/log", name="logs")
    def log(job_id: str, request: Request, since: int = 0, attempt: Optional[int] = None) -> dict:
        """The log's chunks from ``since`` on (of one ``attempt`` if given), joined, and each one's length: a
        follower reads again from its last chunk, the only one that still grows."""
        found = ctx.readable(request, job_id)
        chunks = [] if found.elsewhere else log_chunks(found.store, job_id, attempt)
        parts = []
        for _, _, key in chunks[max(0, since):]:
            try:
                parts.append(clean(found.store.get_bytes(key).decode("utf-8", errors="replace")))
            except FileNotFoundError:
                parts.append("")
        return {"text": "".join(parts), "chunks": len(chunks), "sizes": [len(part) for part in parts]}

    @app.get("/api/jobs/{job_id}/artifacts/{which}", name="download")
    def download(job_id: str, which: str, request: Request) -> Response:
        found = ctx.readable(request, job_id)
        try:
            ref, name = job_view.artifact(found.manifest, which)
        except FileNotFoundError as exc:
            raise HTTPException(404, str(exc))
        return Response(read_verified(found.store, ref), media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _pool_reads(app: FastAPI, ctx: Context) -> None:
    clean = ctx.access.clean

    @app.get("/api/health", name="health")
    def health() -> dict:
        """Open to anyone (a load balancer's probe): says the server runs, and nothing of the pool."""
        return {"ok": True}

    @app.get("/api/info", name="info")
    def info(request: Request) -> dict:
        from importlib.metadata import version

        who = ctx.access.reader(request)
        return {"version": version("baton"), "actions": ctx.access.pool or ctx.access.token is not None,
                "pool": ctx.access.pool, **({"principal": who.model_dump(mode="json")} if ctx.access.pool else {}),
                "history_error": clean(ctx.history.error) if ctx.history.error else None}

    @app.get("/api/queue", name="queue")
    def queue(request: Request, name: Optional[str] = None) -> dict:
        ctx.access.reader(request)  # (every user sees every queue's line, as Slurm's squeue does: ids, teams, reasons)
        return clean({"queues": [_queue_view(view) for view in queue_views(ctx.records, name)],
                      "quotas": ctx.records.pool.quotas()})

    @app.get("/api/workers", name="workers")
    def workers(request: Request) -> dict:
        ctx.access.reader(request)
        return clean({"workers": presence.seen(ctx.records.redis)})


def _queue_view(view: Any) -> dict:
    return {"queue": view.queue,
            "waiting": [{"id": job.job_id, "name": job.name, "team": job.team, "priority": job.priority,
                         "position": job.position, "submitted_at": job.submitted_at, "slots": job.slots,
                         "submitted_by": job.submitted_by or None,
                         "next_attempt": job.attempt, "reason": view.reasons.get(job.job_id)}
                        for job in view.state.waiting],
            "running": [status.model_dump(mode="json", include={"id", "name", "team", "priority", "worker", "step",
                                                                "total_steps", "attempt", "submitted_by"})
                        for status in view.running],
            "usage": view.state.usage, "quotas": view.state.quotas, "workers": view.workers,
            "drained": sorted(view.drained), "yielded": sorted(view.yielded)}


BODY_LIMIT = 4096
"""The most an action's body may hold (its JSON is a field or two): read only once the token is checked."""
SUBMIT_LIMIT = 1 << 20
"""The most a submit's body may hold (a spec, its overrides)."""


SUBMITS = ("/api/jobs", "/api/sweeps", "/api/searches", "/api/validate")


def body_limit(request: Request) -> int:
    """A submit's limit, an archive of code's (the server's BATON_CODE_LIMIT_MB), or an action's."""
    if request.method == "POST" and request.url.path in SUBMITS:
        return SUBMIT_LIMIT
    if request.method == "PUT" and request.url.path.startswith("/api/code/"):
        return int(request.app.state.ctx.settings.code_limit_mb * 1e6)
    return BODY_LIMIT


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def small_json(request: Request, empty: Optional[dict] = None) -> dict:
    """The request's JSON object, read after the token was checked and never more than its limit
    (``body_limit``); ``empty`` when it has no body (422 when one is needed)."""
    body = b""
    limit = body_limit(request)
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, f"this request's body holds at most {limit} bytes")
    if not body.strip():
        if empty is None:
            raise HTTPException(422, "a JSON body is needed")
        return empty
    try:
        value = json.loads(body, parse_constant=_no_constant)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):  # (4,000 '[' fit in the limit and nest too deep to decode)
        raise HTTPException(422, "the body is not JSON (or nests too deep, or holds NaN or Infinity, which JSON "
                            "has not)")
    except UnicodeEncodeError:  # (an escaped lone surrogate, \ud800: no character, and no answer could name it)
        raise HTTPException(422, "the body holds a lone surrogate (\\ud800-\\udfff), which is no character")
    if not isinstance(value, dict):
        raise HTTPException(422, "the body must be a JSON object")
    return value


def _actions(app: FastAPI, ctx: Context) -> None:
    clean = ctx.access.clean

    @app.post("/api/jobs/{job_id}/cancel", name="cancel")
    def cancel(job_id: str, request: Request) -> dict:
        ctx.acted_on(request, "cancel", job_id)
        return clean({"id": job_id, "result": ctx.client.job(job_id).cancel()})

    @app.post("/api/jobs/{job_id}/resume", name="resume")
    async def resume(job_id: str, request: Request) -> dict:
        await run_in_threadpool(ctx.acted_on, request, "resume", job_id)
        pause_at = (await small_json(request, {})).get("pause_at")
        if pause_at is not None and (isinstance(pause_at, bool) or not isinstance(pause_at, int) or pause_at < 1):
            raise HTTPException(422, "pause_at must be an integer of 1 or more")
        try:
            attempt = await run_in_threadpool(lambda: ctx.client.job(job_id).resume(pause_at))
        except ValueError as exc:
            raise HTTPException(409, clean(str(exc)))
        return {"id": job_id, "attempt": attempt}

    @app.post("/api/jobs/{job_id}/priority", name="priority")
    async def priority(job_id: str, request: Request) -> dict:
        await run_in_threadpool(ctx.acted_on, request, "priority", job_id)
        value = (await small_json(request)).get("priority")
        if isinstance(value, bool) or not isinstance(value, int):
            raise HTTPException(422, "priority must be an integer")
        try:
            await run_in_threadpool(lambda: ctx.client.job(job_id).set_priority(value))
        except ValueError as exc:
            code = 409 if "only a waiting" in str(exc) else 403 if "max priority" in str(exc) else 422
            raise HTTPException(code, clean(str(exc)))
        return {"id": job_id, "priority": value}

    @app.post("/api/workers/{name}/drain", name="drain")
    async def drain_worker(name: str, request: Request) -> dict:
        await run_in_threadpool(ctx.pool_action, request, "drain")
        drained = (await small_json(request, {})).get("drained", True)
        if not isinstance(drained, bool):
            raise HTTPException(422, "drained must be true or false")
        try:
            full, changed = await run_in_threadpool(drain, ctx.records, name, drained)
        except ValueError as exc:
            raise HTTPException(404, clean(str(exc)))
        return {"worker": full, "drained": drained, "changed": changed}
