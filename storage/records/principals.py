"""The pool's principals in Redis, and the tokens they prove themselves with.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``bt_``, printed once when it is
made and never stored: Redis holds its SHA-256 (``keys.TOKENS``: digest -> name, and the digest in the
principal's record). A token of that entropy cannot be guessed from its digest, so a slow password hash
would only slow every request (as GitHub and PyPI store their API tokens). A lookup goes by digest and the
record's digest is compared with ``hmac.compare_digest``: no timing of a comparison of the token itself.
Adding, removing and rotating are each one transaction (``WATCH``/``MULTI``): a token that was removed or
replaced is refused by every reader from the moment it returns.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Optional

import redis

from baton.schemas.principals import Principal, Role
from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, text, texts

TOKEN_PREFIX = "bt_"


class PrincipalError(ValueError):
    """A principal that exists already, or does not."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class Principals:
    def __init__(self, r: redis.Redis):
        self.redis = r

    def add(self, principal: Principal) -> str:
        """Record ``principal`` (with ``created_at`` now); its token, which is stored nowhere."""
        token = new_token()
        record: dict = {"role": principal.role.value, "teams": json.dumps(list(principal.teams)),
                  "service": "1" if principal.service else "", "created_at": repr(time.time()),
                  "token": digest(token)}
        key = keys.principal(principal.name)
        with self.redis.pipeline() as pipe:
            pipe.watch(key)
            if pipe.exists(key):
                raise PrincipalError(f"user {principal.name} exists already")
            pipe.multi()
            pipe.hset(key, mapping=record)
            pipe.hset(keys.TOKENS, record["token"], principal.name)
            pipe.execute()
        return token

    def get(self, name: str) -> Optional[Principal]:
        record = texts(self.redis.hgetall(keys.principal(name)))
        return _principal(name, record) if record else None

    def list(self) -> list[Principal]:
        names = sorted(text(n) for n in self.redis.hvals(keys.TOKENS))
        return [p for p in (self.get(name) for name in names) if p is not None]

    def remove(self, name: str) -> None:
        """Remove ``name`` and its token (refused from now on)."""
        key = keys.principal(name)
        with self.redis.pipeline() as pipe:
            pipe.watch(key)
            old = maybe_text(pipe.hget(key, "token"))
            if old is None:
                raise PrincipalError(f"no user {name}")
            pipe.multi()
            pipe.delete(key)
            pipe.hdel(keys.TOKENS, old)
            pipe.execute()

    def rotate(self, name: str) -> str:
        """A new token for ``name``; the old one is refused from now on."""
        key = keys.principal(name)
        token = new_token()
        with self.redis.pipeline() as pipe:
            pipe.watch(key)
            old = maybe_text(pipe.hget(key, "token"))
            if old is None:
                raise PrincipalError(f"no user {name}")
            pipe.multi()
            pipe.hdel(keys.TOKENS, old)
            pipe.hset(key, "token", digest(token))
            pipe.hset(keys.TOKENS, digest(token), name)
            pipe.execute()
        return token

    def authenticate(self, token: str) -> Optional[Principal]:
        """The principal ``token`` belongs to now, or None (unknown, removed, rotated, malformed)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 128:
            return None
        given = digest(token)
        name = maybe_text(self.redis.hget(keys.TOKENS, given))
        if name is None:
            return None
        record = texts(self.redis.hgetall(keys.principal(name)))
        if not record or not hmac.compare_digest(record.get("token", ""), given):
            return None  # rotated or removed between the two reads
        return _principal(name, record)


def _principal(name: str, record: dict[str, str]) -> Principal:
    return Principal(name=name, role=Role(record["role"]), teams=tuple(json.loads(record.get("teams") or "[]")),
                     service=bool(record.get("service")), created_at=float(record.get("created_at") or 0))
