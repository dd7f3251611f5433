"""The pool's server writes down every action asked of it, allowed or refused, and every refused read:
who (the token's principal, or nobody), what (the route's name), on what (its path's names), the result
and why, and the client's address. Each entry goes to Redis at once (bounded: ``storage.records.audit``)
and, every ``FLUSH_EVERY_S``, the entries since the last flush go to the store as one object of JSON
lines under ``audit/DAY/`` (the store keeps them all; Redis keeps the recent ones for ``baton audit``).
Successful reads are not written down: they change nothing, and a dashboard reads every second."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Callable, Optional

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from baton.schemas.audit import AuditEntry
from baton.storage.records import audit
from baton.storage.stores.base import ObjectStore

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 5.0
AUDIT_PREFIX = "audit"


def _text(value: str) -> str:
    """``value`` as UTF-8 can hold it (a lone surrogate a client sent in a path becomes '?'): an entry always writes."""
    return value.encode("utf-8", "replace").decode("utf-8")


def audited(request: Request, status: int) -> bool:
    """Whether this request goes in the trail: any API request that is not a read, and a refused read."""
    return request.url.path.startswith("/api/") and (request.method not in ("GET", "HEAD") or status in (401, 403))


class AuditTrail:
    def __init__(self, redis_client, store: Callable[[], ObjectStore], flush_every_s: float = FLUSH_EVERY_S):
        self.redis, self.store, self.flush_every_s = redis_client, store, flush_every_s
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._writer = f"{socket.gethostname()}-{os.getpid()}"
        self.error: Optional[str] = None  # the last failure to write the store's copy (kept, tried again)

    async def record(self, request: Request, response: Response, started: float) -> Response:
        """Write the request's entry; the response as it was (its body read, when it says why it failed)."""
        status = response.status_code
        reason = ""
        if status >= 400:
            body = b"".join([chunk async for chunk in response.body_iterator])  # type: ignore[attr-defined]
            try:
                detail = json.loads(body).get("detail", "")
                if isinstance(detail, dict) and isinstance(detail.get("problems"), list):  # (a spec's: every problem)
                    detail = "; ".join(map(str, detail["problems"]))
                reason = detail if isinstance(detail, str) else json.dumps(detail)[:300]
            except (ValueError, AttributeError):
                reason = f"HTTP {status}"
            response = Response(body, status, headers=dict(response.headers), media_type=response.media_type)
        route = request.scope.get("route")
        entry = AuditEntry(at=started, principal=getattr(request.state, "principal", None),
                           action=_text(getattr(route, "name", None) or f"{request.method} {request.url.path}"[:200]),
                           target=_text(getattr(request.state, "target", None)
                                        or "/".join(str(v) for v in request.path_params.values())[:200]),
                           result="allowed" if status < 400 else "refused" if status in (401, 403, 413) else "failed",
                           reason=_text(reason[:500]), client=request.client.host if request.client else "")
        await run_in_threadpool(self.append, entry)
        return response

    def append(self, entry: AuditEntry) -> None:
        audit.append(self.redis, entry)
        with self._lock:
            self._pending.append(entry.model_dump_json())

    def flush(self) -> None:
        """The entries since the last flush, as one object in the store (kept for the next one if it fails)."""
        with self._lock:
            lines, self._pending = self._pending, []
        if not lines:
            return
        now = time.time()
        key = f"{AUDIT_PREFIX}/{time.strftime('%Y-%m-%d', time.gmtime(now))}/{time.time_ns()}-{self._writer}.jsonl"
        try:
            self.store().put_bytes(key, ("\n".join(lines) + "\n").encode())
            self.error = None
        except Exception as exc:  # noqa: BLE001 - the store is down: keep them, say so, go on serving
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("cannot write the audit trail's copy to the store (kept for the next try): %s", self.error)
            with self._lock:
                self._pending = lines + self._pending

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="baton-audit-flush", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.flush_every_s):
            self.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()
