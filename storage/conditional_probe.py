"""Checking that a store really does conditional writes, before a worker trusts it with jobs.

The manifest commit is a compare-and-swap (``put_if``). Some S3-compatible stores accept
If-None-Match/If-Match and ignore them: every conditional write then succeeds, and two attempts
overwrite each other's manifest without either noticing. The probe writes a fresh key
conditionally twice and with a stale version once; both later writes must be refused.
"""
from __future__ import annotations

import uuid

from baton.schemas.errors import ConditionalWritesIgnored, PreconditionFailed

from baton.storage.stores.base import ObjectStore
from baton.storage.layout import probe_key


def check_conditional_writes(store: ObjectStore) -> None:
    """ConditionalWritesIgnored (naming the store) unless the store refuses conditional writes
    whose condition does not hold. Leaves nothing behind."""
    key = probe_key(uuid.uuid4().hex)
    try:
        store.put_if(key, b"first", None)
        found = store.read_versioned(key)
        if found is None:
            raise ConditionalWritesIgnored(f"{store.url}: the probe object {key} was written but cannot be read back")
        _must_refuse(store, key, None, "a second write of an existing key with If-None-Match: *")
        _must_refuse(store, key, _other_version(found[1]), "a write with If-Match on an outdated version")
    finally:
        store.delete(key)


def _must_refuse(store: ObjectStore, key: str, version, what: str) -> None:
    try:
        store.put_if(key, b"second", version)
    except PreconditionFailed:
        return
    raise ConditionalWritesIgnored(
        f"storage {store.url} ignores conditional writes: it accepted {what}. The manifest's "
        f"compare-and-swap would silently overwrite there, so no worker runs on it; use a store that "
        f"supports If-None-Match and If-Match (AWS S3, recent MinIO) or file:// on one machine")


def _other_version(version: str) -> str:
    """A version string that is not ``version`` (an ETag or a digest) and belongs to no object."""
    return '"0000000000000000000000000000dead"' if version != '"0000000000000000000000000000dead"' else '"beef"'
