"""``gate://``: the store of a job's own processes, each call made for them by their worker's store gate
(``baton.workers.queue.store_gate``).

The URL names the gate's socket, its key and the store's own URL (``url``, what the job's records and
its ranks' orders name); ``reopen_url`` gives it whole to the job's other processes (its checkpoint
writer, its ranks). Each thread of each process has its own connection, so a checkpoint's upload never
waits behind a log line's. The gate's errors are raised as the store's own would be: FileNotFoundError,
PreconditionFailed, StorageUnavailable (the gate gone too: the worker is), AccessDenied (``OutsideJob``
for a key outside the job).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, unquote, urlparse

from baton.schemas import errors
from baton.storage.stores.base import ObjectStore
from baton.storage.stores.gate_protocol import (CLIENT_HANDSHAKE_S, ERRORS, FRAME_MAX, INLINE_MAX, Op, Reply,
                                                Request, gate_url, memory_file, proof, reachable, read_file,
                                                receive_fd, receive_timeout, send_fd)


class GatedStore(ObjectStore):
    def __init__(self, address: str, key: bytes, url: str):
        self.address, self._key, self.url = address, key, url
        self._local = threading.local()

    @classmethod
    def from_url(cls, url: str) -> "GatedStore":
        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        try:
            return cls(unquote(parsed.path), bytes.fromhex(query["key"][0]), query["url"][0])
        except (KeyError, IndexError, ValueError):
            raise ValueError("a gate:// URL names its socket, key= and url=") from None

    def reopen_url(self) -> Optional[str]:
        return gate_url(self.address, self._key, self.url)

    # --- the interface ---------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes) -> None:
        self._put("put_bytes", key, data)

    def put_file(self, key: str, path: Path, consume: bool = False) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._call(Request(op="put_file", key=key, body="fd"), fd)
        finally:
            os.close(fd)
        if consume:
            Path(path).unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        return _as_bytes(self._call(Request(op="get_bytes", key=key))[1])

    def get_file(self, key: str, path: Path) -> None:
        _, fd = self._call(Request(op="get_file", key=key))
        assert isinstance(fd, int)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        try:
            with os.fdopen(fd, "rb") as source, open(tmp, "wb") as target:
                shutil.copyfileobj(source, target, 8 << 20)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, key: str) -> int:
        value = self._call(Request(op="size", key=key))[0].value
        assert isinstance(value, int)
        return value

    def list(self, prefix: str) -> list[str]:
        value = self._call(Request(op="list", key=prefix))[0].value
        assert isinstance(value, list)
        return value

    def delete(self, key: str) -> None:
        self._call(Request(op="delete", key=key))

    def copy(self, src: str, dst: str) -> None:
        self._call(Request(op="copy", key=src, dst=dst))

    def read_versioned(self, key: str) -> Optional[tuple[bytes, str]]:
        reply, body = self._call(Request(op="read_versioned", key=key))
        if reply.value is None:
            return None
        return _as_bytes(body), str(reply.value)

    def put_if(self, key: str, data: bytes, version: Optional[str]) -> None:
        self._put("put_if", key, data, version)

    # --- the connection --------------------------------------------------------------------------
    def _put(self, op: Op, key: str, data: bytes, version: Optional[str] = None) -> None:
        if len(data) <= INLINE_MAX:
            self._call(Request(op=op, key=key, version=version, body="inline"), bytes(data))
            return
        fd = memory_file(data)
        try:
            self._call(Request(op=op, key=key, version=version, body="fd"), fd)
        finally:
            os.close(fd)

    def _call(self, request: Request, body: "bytes | int | None" = None) -> tuple[Reply, "bytes | int | None"]:
        conn = self._connection()
        try:
            conn.send_bytes(request.model_dump_json().encode())
            if isinstance(body, bytes):
                conn.send_bytes(body)
            elif isinstance(body, int):
                send_fd(conn, body)
            reply = Reply.model_validate_json(conn.recv_bytes(FRAME_MAX))
            out: "bytes | int | None" = None
            if reply.body == "inline":
                out = conn.recv_bytes(FRAME_MAX)
            elif reply.body == "fd":
                out = receive_fd(conn)
        except BaseException as exc:  # a half-done exchange (a signal's exception too): the connection is unusable
            self._local.conn = None
            conn.close()
            if isinstance(exc, (OSError, EOFError, ValueError)):
                raise errors.StorageUnavailable(f"the worker's store gate did not answer ({type(exc).__name__}: {exc})") from None
            raise
        if reply.value_in_body:
            reply = reply.model_copy(update={"value": json.loads(_as_bytes(out)), "body": "none"})
            out = None
        if not reply.ok:
            if isinstance(out, int):
                os.close(out)
            raise ERRORS.get(str(reply.error), errors.StorageUnavailable)(reply.message)
        return reply, out

    def _connection(self) -> Connection:
        """This thread's connection (a new one in a forked child: the parent's is the parent's)."""
        local = self._local
        if getattr(local, "conn", None) is not None and local.pid == os.getpid():
            return local.conn
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn: Optional[Connection] = None
        try:
            sock.settimeout(CLIENT_HANDSHAKE_S)
            with reachable(self.address) as path:
                sock.connect(path)
            receive_timeout(sock.fileno(), CLIENT_HANDSHAKE_S)
            sock.settimeout(None)  # (blocking again: the kernel's timeout above bounds the handshake's reads)
            conn = Connection(sock.detach())
            challenge = conn.recv_bytes(64)
            conn.send_bytes(proof(self._key, challenge))
            if conn.recv_bytes(16) != b"ok":
                raise EOFError("the gate refused the key")
            receive_timeout(conn.fileno(), 0)  # a call may be long
        except (OSError, EOFError) as exc:
            (conn or sock).close()
            raise errors.StorageUnavailable(f"cannot reach the worker's store gate ({type(exc).__name__}: {exc})") from None
        local.conn, local.pid = conn, os.getpid()
        return conn


def _as_bytes(body: "bytes | int | None") -> bytes:
    if isinstance(body, bytes):
        return body
    assert isinstance(body, int)
    try:
        return read_file(body)
    finally:
        os.close(body)
