"""An infrastructure mistake as one line: Redis or the store could not be used.

Every command ends such a failure the same way: one line on stderr naming what failed and what to
check, exit ``EXIT_INFRASTRUCTURE``, and the traceback only under ``baton --debug``. The mistakes are
the configuration's (a wrong ``BATON_REDIS_URL``, bucket, credentials, endpoint or store path), not
the job's: nothing about the job is wrong, and nothing was half-written (every write baton makes is
whole or absent).
"""
from __future__ import annotations

from typing import Optional

from pydantic import ValidationError

from baton.schemas.errors import AccessDenied, StorageUnavailable, StoreUnusable

EXIT_INFRASTRUCTURE = 5

STORE_ERRORS = (AccessDenied, StoreUnusable, StorageUnavailable)
"""A store that refused the credentials, cannot be used, or did not answer through the retries."""


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis
    from kombu.exceptions import OperationalError

    return redis.RedisError, OperationalError


def settings_line(exc: ValidationError) -> str:
    """A setting that does not validate (``BatonSettings``), as one line naming each variable."""
    said = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        names = [str(part) for part in error["loc"]]
        said.append(f"BATON_{'_'.join(names).upper()}: {message}" if names else message)
    return "error: " + "; ".join(said)


def explain(exc: BaseException, redis_url: str) -> Optional[str]:
    """The one line for ``exc`` when it is an infrastructure mistake, else None. URLs may hold a
    password: the caller redacts the line."""
    if isinstance(exc, ValidationError) and exc.title == "BatonSettings":
        return settings_line(exc)
    if isinstance(exc, _redis_errors()):
        return (f"error: cannot use Redis at {redis_url}: {type(exc).__name__}: {str(exc).rstrip('.')}; check BATON_REDIS_URL "
                "and that redis-server runs there")
    if isinstance(exc, AccessDenied):
        return f"error: the store refused the credentials: {exc}"
    if isinstance(exc, StoreUnusable):
        return f"error: cannot use the store: {exc}; check BATON_STORAGE_URL (or --storage)"
    if isinstance(exc, StorageUnavailable):
        return (f"error: the store does not answer: {exc}; check AWS_ENDPOINT_URL (or the endpoint in your AWS "
                "config) and that the endpoint is up")
    return None
