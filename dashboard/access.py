"""Who may do what on the dashboard and the pool's server: one application, two ways to say who asks.

- **Local** (``baton ui``, one trusted person): reading (the pages, every ``GET``) is open to whoever can reach
  the address it listens on, by default 127.0.0.1 only. Acting (cancel, resume, priority, drain) needs the
  token the dashboard was started with (``BATON_UI_TOKEN``); without one it is read-only.
- **Pool** (``baton server``): every request but the health check and the pages' static files names a
  principal by its token (``baton users``), or is refused (401); what the principal may do is the role
  table's (``baton.jobs.roles``), refused with 403. A token is looked up in Redis at each request, so one
  removed or rotated is refused by every server from the moment the change returns.

Either way the token rides in ``Authorization: Bearer <token>`` and nowhere else: never a cookie (no other
site's form or script carries it; a cookie is ignored), never a query string (logs, history). A browser
sends a custom ``Authorization`` header cross-origin only after a CORS preflight, which this application
never approves. Requests whose ``Host`` is not one the server serves (DNS rebinding) are refused outright,
and an ``Origin`` that is not the server's own is refused on actions (and, in pool mode, on reads).
"""
from __future__ import annotations

import hmac
from typing import Any, Optional

from fastapi import HTTPException, Request

from baton.schemas.principals import Principal, Role
from baton.storage.records.principals import Principals
from baton.storage.redaction import Redactor

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
READER = Principal(name="local-reader", role=Role.admin)
"""Who reads in local mode: anyone who can reach the address, as the operator."""
OPERATOR = Principal(name="operator", role=Role.admin)
"""Who acts in local mode: whoever holds BATON_UI_TOKEN."""


def bearer(request: Request) -> Optional[str]:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


class Access:
    def __init__(self, token: Optional[str], allowed_hosts: list[str], principals: Optional[Principals] = None):
        self.token = token or None
        self.allowed_hosts = allowed_hosts  # host names (no port) that may appear in Host; '*' for any
        self.principals = principals  # set: pool mode
        self.redact = Redactor()

    @property
    def pool(self) -> bool:
        return self.principals is not None

    def check_host(self, request: Request) -> Optional[str]:
        """Why this request's Host is refused, or None."""
        if "*" in self.allowed_hosts:
            return None
        host = (request.headers.get("host") or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return None if name in self.allowed_hosts else f"host {host!r} is not served here"

    def _same_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1].lower() != (request.headers.get("host") or "").lower():
            raise HTTPException(403, f"a request from another site ({origin}) is refused")

    def _signed_in(self, request: Request) -> Principal:
        assert self.principals is not None
        token = bearer(request)
        who = self.principals.authenticate(token) if token else None
        if who is None:
            raise HTTPException(401, "a valid token is needed (Authorization: Bearer <token>; `baton users` makes them)"
                                if token else "sign in: send your token as Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})
        request.state.principal = who.name
        return who

    def reader(self, request: Request) -> Principal:
        """Who reads: in pool mode the token's principal (401 without one), else anyone, as the operator."""
        if not self.pool:
            return READER
        who = self._signed_in(request)
        self._same_origin(request)
        return who

    def actor(self, request: Request) -> Principal:
        """Who acts: in pool mode the token's principal (401 without one); in local mode the holder of the
        dashboard's token (403 otherwise, or always when it has none). Never from another site's page."""
        if self.pool:
            who = self._signed_in(request)
        else:
            if self.token is None:
                raise HTTPException(403, "this dashboard is read-only: start it with BATON_UI_TOKEN set to allow actions")
            given = bearer(request) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise HTTPException(403, "an action needs the dashboard's token (Authorization: Bearer <BATON_UI_TOKEN>)")
            who = OPERATOR
        self._same_origin(request)
        return who

    def require(self, request: Request, refusal: Optional[str]) -> None:
        """403 with ``refusal`` (a role check's answer), unless it is None."""
        if refusal is not None:
            raise HTTPException(403, refusal)

    def clean(self, value: Any, names: bool = True) -> Any:
        """``value`` with every string redacted (secrets of this environment, any URL's password), but the
        names of things in baton's own answers (``IDENTIFIERS``, while ``names``): a job's id or a checkpoint's
        key is what a link is made of. What the user wrote (``USER_CONTENT``: a spec's kwargs) is redacted whole."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {key: item if names and key in IDENTIFIERS and isinstance(item, str)
                    else self.clean(item, names and key not in USER_CONTENT) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.clean(item, names) for item in value]
        return value


IDENTIFIERS = frozenset({"id", "job_id", "for_job", "sweep", "search", "key", "which", "file", "kind", "state", "queue",
                         "team", "worker", "name", "submitted_by", "latest_checkpoint", "best_checkpoint", "monitor"})
"""The fields of the API's answers that name things (ids, keys, states): shown as they are."""
USER_CONTENT = frozenset({"spec", "overrides", "report", "kwargs", "metrics", "search"})
"""Where an answer holds what a user wrote or a job computed: nothing below these is exempt from redaction."""
