"""One call a store gate makes for its job (``store_gate``): the request already checked, its body received.

Bodies leave the worker's memory as soon as they can: an object read for the job is downloaded into a
file of the gate's own directory and passed as a descriptor (read inline only when it is small), an
upload is read from the file the job passed. What the store raised is said in the reply by its name
(``gate_protocol.ERRORS``), so the job's side raises the same; anything else is StorageUnavailable, and
logged. The job's log chunks are redacted here with the worker's own secrets, which the job's process
does not hold.
"""
from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Callable

from baton.storage.layout import log_chunk_of
from baton.storage.stores.base import ObjectStore
from baton.storage.stores.gate_protocol import INLINE_MAX, Reply, Request, error_name, memory_file, read_file

_log = logging.getLogger("baton.worker")

PUT_IF_MAX = 64 << 20
"""The largest body of a compare-and-swap (a manifest is kilobytes), read into memory."""


def perform(store: ObjectStore, request: Request, body: "bytes | int | None", scratch: Path,
            redact: Callable[[str], str], job_id: str) -> tuple[Reply, "bytes | int | None"]:
    """The reply to ``request`` and its body (bytes, or a descriptor the caller sends and closes)."""
    try:
        return _do(store, request, body, scratch, redact)
    except Exception as exc:  # noqa: BLE001 - every failure is said to the client, by its kind
        name = error_name(exc)
        if name is None:
            _log.warning("job %s: store gate: %s of %r failed: %s: %s", job_id, request.op, request.key[:200],
                         type(exc).__name__, exc)
        message = str(exc) if name is not None else f"{type(exc).__name__}: {exc}"
        return Reply(ok=False, error=name or "StorageUnavailable", message=message), None


def _do(store: ObjectStore, request: Request, body: "bytes | int | None", scratch: Path,
        redact: Callable[[str], str]) -> tuple[Reply, "bytes | int | None"]:
    key, op = request.key, request.op
    if op in ("put_bytes", "put_file") and log_chunk_of(key) is not None:
        text = read_all(body, PUT_IF_MAX).decode("utf-8", errors="surrogateescape")
        store.put_bytes(key, redact(text).encode("utf-8", errors="surrogateescape"))
    elif op in ("put_bytes", "put_file") and isinstance(body, int):
        store.put_file(key, Path(f"/proc/self/fd/{body}"))  # a file the client could read (readable_file)
    elif op == "put_bytes":
        assert isinstance(body, bytes)
        store.put_bytes(key, body)
    elif op == "put_if":
        store.put_if(key, read_all(body, PUT_IF_MAX), request.version)
    elif op == "get_bytes":
        return small_inline(download(store, key, scratch))
    elif op == "get_file":
        return Reply(ok=True, body="fd"), download(store, key, scratch)
    elif op == "read_versioned":
        found = store.read_versioned(key)
        if found is None:
            return Reply(ok=True), None
        if len(found[0]) > PUT_IF_MAX:
            raise ValueError(f"{key}: too large for a compare-and-swap ({len(found[0])} bytes)")
        return Reply(ok=True, value=found[1], body="inline" if len(found[0]) <= INLINE_MAX else "fd"), (
            found[0] if len(found[0]) <= INLINE_MAX else memory_file(found[0]))
    elif op == "size":
        return Reply(ok=True, value=store.size(key)), None
    elif op == "list":
        return Reply(ok=True, value=store.list(key)), None
    elif op == "delete":
        store.delete(key)
    elif op == "copy":
        assert request.dst is not None
        store.copy(key, request.dst)
    return Reply(ok=True), None


def download(store: ObjectStore, key: str, scratch: Path) -> int:
    """The object in a file of ``scratch`` (the gate's own directory), opened for reading and unlinked."""
    path = scratch / f"get-{secrets.token_hex(8)}"
    try:
        store.get_file(key, path)
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    finally:
        path.unlink(missing_ok=True)


def small_inline(fd: int) -> tuple[Reply, "bytes | int"]:
    """A downloaded object: its bytes when it fits a frame (the descriptor closed), else the descriptor."""
    size = os.fstat(fd).st_size
    if size > INLINE_MAX:
        return Reply(ok=True, body="fd"), fd
    try:
        return Reply(ok=True, body="inline"), os.pread(fd, size, 0) if size else b""
    finally:
        os.close(fd)


def read_all(body: "bytes | int | None", limit: int) -> bytes:
    """A request's body as bytes (a descriptor's file read whole, up to ``limit``)."""
    if isinstance(body, bytes):
        return body
    assert isinstance(body, int)
    return read_file(body, limit)
