"""The pool's principals in Redis, and the tokens they prove themselves with.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the prefix ``bt_``, printed once when it is
made and never stored: Redis holds its SHA-256 (``keys.TOKENS``: digest -> name; the digest is also in the
principal's record). A token of that entropy cannot be found from its digest, so a slow password hash
would only slow every request (GitHub and PyPI keep their API tokens the same way). A token is looked up
by its digest, so no comparison's timing depends on the token; the record's digest is checked too, which
refuses an index entry a rotation left behind. Names are listed in ``keys.PRINCIPALS``.

Adding, removing and rotating are each one transaction (``WATCH``/``MULTI``, retried when another client
changed the principal meanwhile): a token that was removed or replaced is refused by every reader from
the moment the call returns.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import time
from typing import Optional

import redis
from pydantic import ValidationError

from baton.schemas.principals import PRINCIPAL_PATTERN, Principal, Role
from baton.storage.records import keys
from baton.storage.records.connection import maybe_text, text, texts

TOKEN_PREFIX = "bt_"
_TOKEN = re.compile(r"bt_[A-Za-z0-9_-]{40,100}")


class PrincipalError(ValueError):
    """A principal that exists already, or does not, or a name that no principal could have."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _checked(name: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(PRINCIPAL_PATTERN, name):
        raise PrincipalError(f"{name!r} is not a user's name (lower case letters, digits, '.', '_', '-')")
    return name


class Principals:
    def __init__(self, r: redis.Redis):
        self.redis = r

    def add(self, principal: Principal) -> str:
        """Record ``principal`` (made now); its token, which is stored nowhere."""
        token = new_token()
        record: dict = {"role": principal.role.value, "teams": json.dumps(list(principal.teams)),
                        "service": "1" if principal.service else "", "created_at": repr(time.time()),
                        "token": digest(token)}
        key = keys.principal(principal.name)

        def write(pipe: redis.client.Pipeline) -> None:
            if pipe.exists(key):
                raise PrincipalError(f"user {principal.name} exists already")
            pipe.multi()
            pipe.hset(key, mapping=record)
            pipe.hset(keys.TOKENS, record["token"], principal.name)
            pipe.sadd(keys.PRINCIPALS, principal.name)

        self.redis.transaction(write, key)
        return token

    def get(self, name: str) -> Optional[Principal]:
        record = texts(self.redis.hgetall(keys.principal(_checked(name))))
        return _principal(name, record) if record else None

    def list(self) -> list[Principal]:
        names = sorted(text(n) for n in self.redis.smembers(keys.PRINCIPALS))
        return [p for p in (self.get(name) for name in names) if p is not None]

    def remove(self, name: str) -> None:
        """Remove ``name`` and its token (refused from now on)."""
        key = keys.principal(_checked(name))

        def delete(pipe: redis.client.Pipeline) -> None:
            old = maybe_text(pipe.hget(key, "token"))
            if old is None:
                raise PrincipalError(f"no user {name}")
            pipe.multi()
            pipe.delete(key)
            pipe.hdel(keys.TOKENS, old)
            pipe.srem(keys.PRINCIPALS, name)

        self.redis.transaction(delete, key)

    def rotate(self, name: str) -> str:
        """A new token for ``name``; the old one is refused from now on."""
        key = keys.principal(_checked(name))
        token = new_token()

        def replace(pipe: redis.client.Pipeline) -> None:
            old = maybe_text(pipe.hget(key, "token"))
            if old is None:
                raise PrincipalError(f"no user {name}")
            pipe.multi()
            pipe.hdel(keys.TOKENS, old)
            pipe.hset(key, "token", digest(token))
            pipe.hset(keys.TOKENS, digest(token), name)

        self.redis.transaction(replace, key)
        return token

    def authenticate(self, token: object) -> Optional[Principal]:
        """The principal ``token`` belongs to now, or None (unknown, removed, rotated, malformed)."""
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            return None
        given = digest(token)
        name = maybe_text(self.redis.hget(keys.TOKENS, given))
        if name is None:
            return None
        record = texts(self.redis.hgetall(keys.principal(name)))
        if not hmac.compare_digest(record.get("token", ""), given):
            return None  # an entry a rotation or removal left behind, or one read between their two writes
        try:
            return _principal(name, record)
        except (KeyError, ValueError, ValidationError):
            return None  # a record no version of baton wrote: refused, not an error in the caller


def _principal(name: str, record: dict[str, str]) -> Principal:
    return Principal(name=name, role=Role(record["role"]), teams=tuple(json.loads(record.get("teams") or "[]")),
                     service=bool(record.get("service")), created_at=float(record.get("created_at") or 0))
