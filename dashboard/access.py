"""Who may do what on the dashboard.

Reading (the pages, every ``GET``) is open to whoever can reach the address it listens on: by
default 127.0.0.1 only. Acting (cancel, resume, priority, drain: every ``POST``) needs the token the
dashboard was started with (``BATON_UI_TOKEN``), sent as ``Authorization: Bearer <token>``; without a
token configured the dashboard is read-only and every action is refused.

Cross-site requests cannot act: a browser sends a custom ``Authorization`` header cross-origin only
after a CORS preflight, which this application never approves; the token lives in the page's
``sessionStorage``, never in a cookie, so no other site's form or script carries it. Requests whose
``Host`` is not the one the dashboard serves (DNS rebinding) are refused outright, and an ``Origin``
that is not the dashboard's own is refused on actions.
"""
from __future__ import annotations

import hmac
from typing import Any, Optional

from fastapi import HTTPException, Request

from baton.storage.redaction import Redactor

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")


class Access:
    def __init__(self, token: Optional[str], allowed_hosts: list[str]):
        self.token = token or None
        self.allowed_hosts = allowed_hosts  # host names (no port) that may appear in Host; '*' for any
        self.redact = Redactor()

    def check_host(self, request: Request) -> Optional[str]:
        """Why this request's Host is refused, or None."""
        if "*" in self.allowed_hosts:
            return None
        host = (request.headers.get("host") or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return None if name in self.allowed_hosts else f"host {host!r} is not served here"

    def require_action(self, request: Request) -> None:
        """Raise 403 unless the request carries the token (and, when it says where it comes from, comes
        from this dashboard's own pages)."""
        if self.token is None:
            raise HTTPException(403, "this dashboard is read-only: start it with BATON_UI_TOKEN set to allow actions")
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), self.token.encode()):
            raise HTTPException(403, "an action needs the dashboard's token (Authorization: Bearer <BATON_UI_TOKEN>)")
        origin = request.headers.get("origin")
        if origin is not None and origin.split("://", 1)[-1].lower() != (request.headers.get("host") or "").lower():
            raise HTTPException(403, f"an action from another site ({origin}) is refused")

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
