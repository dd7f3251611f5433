"""Connecting to Redis: ``redis://`` or ``rediss://`` (TLS, certificates verified)."""
from __future__ import annotations

import ssl
from typing import Any, Optional

import redis

from baton.schemas.settings import BatonSettings


def ssl_options(url: str, ca_certs: str = "") -> dict:
    """TLS options for a rediss:// URL: certificates are always verified (kombu and redis-py
    would otherwise accept any certificate when none are given)."""
    if not url.startswith("rediss://"):
        return {}
    options: dict[str, object] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    if ca_certs:
        options["ssl_ca_certs"] = ca_certs
    return options


def connect(settings: BatonSettings) -> redis.Redis:
    options = {k: ("required" if v == ssl.CERT_REQUIRED else v) for k, v in
               ssl_options(settings.redis_url, settings.redis_ca_certs).items()}
    return redis.Redis.from_url(settings.redis_url, decode_responses=True, health_check_interval=30,
                                socket_connect_timeout=5, socket_timeout=10, **options)


def answers_strangers(settings: BatonSettings) -> bool:
    """Whether the Redis of ``settings`` lets in a client that gives no user and no password (its default user
    has none): then whoever reaches its address, a job's code on a worker's machine included, may read and
    change every record of the pool. False where it does not, or cannot be asked (away)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(settings.redis_url)
    anonymous = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))  # (no user, no password)
    stranger = connect(settings.model_copy(update={"redis_url": anonymous}))
    try:
        return bool(stranger.ping())
    except redis.RedisError:  # (NOAUTH: a password is asked; or away)
        return False
    finally:
        stranger.close()


def open_redis_warning(settings: BatonSettings) -> Optional[str]:
    """One line for an operator whose Redis ``answers_strangers``, or None."""
    if not answers_strangers(settings):
        return None
    return ("warning: Redis answers without a password: anyone who reaches it, a job's code on this machine "
            "included, can read and change every job's record; give it one (requirepass, or ACL users: "
            "docs/security.md) and put it in BATON_REDIS_URL")


def text(value: Any) -> str:
    """A Redis answer as the ``str`` it is (the connection decodes responses; redis-py's types say bytes or str)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def maybe_text(value: Any) -> Optional[str]:
    """``text``, where Redis may answer nothing."""
    return None if value is None else text(value)


def texts(mapping: Any) -> dict[str, str]:
    """A hash's fields and values, as ``str``."""
    return {text(key): text(value) for key, value in mapping.items()}
