"""A store gate: one attempt's store, served to its training process over a Unix socket, for that job's
own objects only.

The training process runs the job's code, so it is given no store of its own: what it opens
(``gated.GatedStore``) asks the gate, threads of the worker that holds the real store and its
credentials, for each call. The gate serves keys under ``jobs/<id>/`` alone (``within``): another
job's objects, the store's shipped code, a key that climbs out with ``..`` are refused (``OutsideJob``),
and the refusal is logged. Each connection must first prove the gate's key (``gate_protocol``), which
only the attempt's own processes are given. A gate lives as long as its attempt's training process:
``close`` refuses whatever arrives after it.

What it reads from the client: JSON requests (``Request``), frames of at most ``INLINE_MAX`` bytes, and
descriptors of regular files opened for reading; anything else closes that connection.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Optional
from urllib.parse import quote, urlencode

from pydantic import ValidationError

from baton.schemas.errors import (AccessDenied, OutsideJob, PreconditionFailed, StorageUnavailable,
                                  StoreUnusable)
from baton.storage import owned_dirs
from baton.storage.layout import JOBS_PREFIX, check_job_id
from baton.storage.stores.base import ObjectStore
from baton.storage.stores.gate_protocol import (FRAME_MAX, HANDSHAKE_S, INLINE_MAX, Reply, Request, proof,
                                                readable_file, receive_fd, send_fd, within)

_log = logging.getLogger("baton.worker")

MAX_CONNECTIONS = 64
"""Connections one gate serves at once (a thread each: the training process's threads, its checkpoint
writer, its ranks); more are closed at once."""
BODY_KINDS = {"put_bytes": ("inline", "fd"), "put_if": ("inline", "fd"), "put_file": ("fd",)}
"""The bodies a request may carry (every other request carries none)."""
_KNOWN = (FileNotFoundError, PreconditionFailed, StorageUnavailable, AccessDenied, StoreUnusable)


class Refused(Exception):
    """The client sent what no honest client sends: its connection is closed."""


class StoreGate:
    """Serves ``store`` for job ``job_id`` on a socket in a directory of its own (0700)."""

    def __init__(self, store: ObjectStore, job_id: str):
        self.store, self.job_id = store, check_job_id(job_id)
        self.root = f"{JOBS_PREFIX}{job_id}/"
        self.key = secrets.token_bytes(32)
        self.directory = owned_dirs.make(owned_dirs.GATE_PREFIX)
        self.address = str(self.directory / "store.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.address)
        self._sock.listen(16)
        self._closed = threading.Event()
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"baton-gate-{job_id}", daemon=True).start()

    @property
    def url(self) -> str:
        """What the job's processes open (``open_store``): the socket, the key and the store's own URL."""
        return f"gate://{quote(self.address)}?" + urlencode({"key": self.key.hex(), "url": self.store.url})

    def close(self) -> None:
        """Serve nothing more: the listening socket and every connection are shut."""
        self._closed.set()
        _shut(self._sock)
        self._sock.close()
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _shut_connection(conn)
        owned_dirs.remove(self.directory)

    def __enter__(self) -> "StoreGate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- connections ---------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return  # closed
            conn = Connection(sock.detach())
            with self._lock:
                if self._closed.is_set() or len(self._conns) >= MAX_CONNECTIONS:
                    conn.close()
                    continue
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=f"baton-gate-{self.job_id}-conn",
                             daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        try:
            if self._handshake(conn):
                while not self._closed.is_set():
                    self._answer(conn, conn.recv_bytes(FRAME_MAX))
        except Refused as exc:
            _log.warning("job %s: its store gate closed a connection that %s", self.job_id, exc)
        except (EOFError, OSError):
            pass  # the client went away (or sent a frame over the limit)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handshake(self, conn: Connection) -> bool:
        challenge = secrets.token_bytes(32)
        _receive_timeout(conn, HANDSHAKE_S)  # a connection that never answers holds no thread for long
        conn.send_bytes(challenge)
        answer = conn.recv_bytes(64)
        _receive_timeout(conn, 0)
        if not secrets.compare_digest(answer, proof(self.key, challenge)):
            return False
        conn.send_bytes(b"ok")
        return True

    # --- one request -----------------------------------------------------------------------------
    def _answer(self, conn: Connection, raw: bytes) -> None:
        try:
            request = Request.model_validate_json(raw)
        except ValidationError as exc:
            raise Refused(f"sent a malformed request ({exc.error_count()} errors)") from None
        if request.body not in BODY_KINDS.get(request.op, ("none",)) or (request.dst is None) != (request.op != "copy"):
            raise Refused(f"sent a {request.op} request of the wrong shape")
        body = self._receive_body(conn, request)
        try:
            outside = next((k for k in (request.key, request.dst) if k is not None and not within(k, self.root)), None)
            if outside is not None:
                _log.warning("job %s: refused %s of %r: outside the job's own objects", self.job_id, request.op, outside)
                raise OutsideJob(f"{request.op} {outside!r}: a job's processes reach only its own objects ({self.root})")
            if self._closed.is_set():
                raise StorageUnavailable("the attempt's store gate is closed")
            reply, out = self._do(request, body)
        except _KNOWN as exc:
            reply, out = Reply(ok=False, error=type(exc).__name__, message=str(exc)), None
        except Exception as exc:  # noqa: BLE001 - the store's own trouble, said to the client as unavailable
            _log.warning("job %s: store gate: %s of %r failed: %s: %s", self.job_id, request.op, request.key,
                         type(exc).__name__, exc)
            reply, out = Reply(ok=False, error="StorageUnavailable", message=f"{type(exc).__name__}: {exc}"), None
        finally:
            if isinstance(body, int):
                os.close(body)
        self._reply(conn, reply, out)

    def _receive_body(self, conn: Connection, request: Request) -> "bytes | int | None":
        if request.body == "inline":
            data = conn.recv_bytes(FRAME_MAX)
            if len(data) > INLINE_MAX:
                raise Refused("sent an inline body over the limit")
            return data
        if request.body == "fd":
            try:
                fd = receive_fd(conn)
            except ValueError as exc:
                raise Refused(str(exc)) from None
            try:
                readable_file(fd)
            except (ValueError, OSError) as exc:
                os.close(fd)
                raise Refused(f"passed a file it may not upload: {exc}") from None
            return fd
        return None

    def _do(self, request: Request, body: "bytes | int | None") -> tuple[Reply, "bytes | int | None"]:
        store, key, op = self.store, request.key, request.op
        if op in ("put_bytes", "put_file") and isinstance(body, int):
            store.put_file(key, Path(f"/proc/self/fd/{body}"))  # a file the client could read (readable_file)
        elif op == "put_bytes":
            assert isinstance(body, bytes)
            store.put_bytes(key, body)
        elif op == "put_if":
            store.put_if(key, body if isinstance(body, bytes) else _read_all(body), request.version)
        elif op == "get_bytes":
            return _with_body(store.get_bytes(key))
        elif op == "get_file":
            return Reply(ok=True, body="fd"), self._download(key)
        elif op == "read_versioned":
            found = store.read_versioned(key)
            if found is None:
                return Reply(ok=True), None
            reply, out = _with_body(found[0])
            return reply.model_copy(update={"value": found[1]}), out
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

    def _download(self, key: str) -> int:
        """The object in a file of the gate's directory, opened for reading and already unlinked."""
        path = self.directory / f"get-{secrets.token_hex(8)}"
        self.store.get_file(key, path)
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            path.unlink(missing_ok=True)

    @staticmethod
    def _reply(conn: Connection, reply: Reply, out: "bytes | int | None") -> None:
        try:
            conn.send_bytes(reply.model_dump_json().encode())
            if isinstance(out, bytes):
                conn.send_bytes(out)
            elif isinstance(out, int):
                send_fd(conn, out)
        finally:
            if isinstance(out, int):
                os.close(out)


def _with_body(data: bytes) -> tuple[Reply, "bytes | int"]:
    if len(data) <= INLINE_MAX:
        return Reply(ok=True, body="inline"), data
    fd = os.memfd_create("baton-gate", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return Reply(ok=True, body="fd"), fd


def _read_all(fd: Optional[int]) -> bytes:
    assert fd is not None
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _receive_timeout(conn: Connection, seconds: float) -> None:
    """SO_RCVTIMEO on the connection's socket (0: none): a read that waits longer fails."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        whole = int(seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv
    except OSError:
        pass


def _shut_connection(conn: Connection) -> None:
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            _shut(sock)
    except OSError:
        pass
