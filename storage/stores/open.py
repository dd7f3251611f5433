"""``open_store(url)``: the one way every component gets an ObjectStore."""
from __future__ import annotations

import logging
from typing import Optional
from urllib.parse import urlparse

from baton.storage.stores.base import ObjectStore
from baton.storage.stores.file_store import FileStore

CLIENT_PATIENCE_S = 3.0
"""How long a command a person waits on retries a store that does not answer (a worker: 20 s a call)."""


def open_client_store(url: str) -> ObjectStore:
    """The store as a client command opens it: an endpoint that is down is said within seconds, in
    one line (its retries are logged at DEBUG, not as warnings)."""
    return open_store(url, CLIENT_PATIENCE_S)


def open_store(url: str, patience_s: Optional[float] = None) -> ObjectStore:
    """``file:///abs/path``, ``file://./rel/path`` or ``s3://bucket[/prefix]``; ``patience_s``: how long an
    S3 call is retried through transient errors, quietly (default: ``s3_store.RETRY_S``, each retry
    a warning)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        path = parsed.netloc + parsed.path  # file://./baton-data keeps its relative path
        if not path:
            raise ValueError(f"storage URL {url!r} has no path")
        return FileStore(path)
    if parsed.scheme == "s3":
        from baton.storage.stores.s3_store import S3Store  # boto3 is imported only when S3 is used

        if patience_s is None:
            return S3Store.from_url(url)
        return S3Store.from_url(url, retry_s=patience_s, retry_log=logging.getLogger("baton.storage").debug)
    if parsed.scheme == "gate":  # a job's own processes: its worker's store gate (workers/queue/store_gate.py)
        from baton.storage.stores.gated import GatedStore

        return GatedStore.from_url(url)
    raise ValueError(f"storage URL must start with file:// or s3:// (got {url!r})")
