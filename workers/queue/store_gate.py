"""A store gate: one attempt's store, served to its training process over a Unix socket, for that job's
own objects only.

The training process runs the job's code, so it is given no store of its own: what it opens
(``gated.GatedStore``) asks the gate, threads of the worker that holds the real store and its
credentials, for each call. The gate serves keys under ``jobs/<id>/`` alone (``within``): another
job's objects, the store's shipped code, a key that climbs out with ``..`` are refused (``OutsideJob``),
and the refusal is logged. Each connection must first prove the gate's key (``gate_protocol``), which
only the attempt's own processes are given. A gate lives as long as its attempt's training process: ``close``
refuses whatever arrives after it and waits for the calls in flight to land, so that nothing the attempt
asked for is written after the worker has moved on (a job's end recorded, its next attempt started).

What it reads from the client: JSON requests (``Request``), frames of at most ``INLINE_MAX`` bytes, and
descriptors of regular files opened for reading; anything else closes that connection, as do
``MAX_REFUSALS`` refused calls. What one call does is ``gate_calls``'.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
from multiprocessing.connection import Connection
from typing import Callable, Optional

from pydantic import ValidationError

from baton.schemas.errors import OutsideJob
from baton.storage import owned_dirs
from baton.storage.layout import JOBS_PREFIX, check_job_id
from baton.storage.stores.base import ObjectStore
from baton.storage.redaction import Redactor
from baton.storage.stores.gate_protocol import (FRAME_MAX, HANDSHAKE_S, INLINE_MAX, Reply, Request, gate_url,
                                                memory_file, proof, reachable, readable_file, receive_fd,
                                                receive_timeout, send_fd, within)
from baton.workers.queue.gate_calls import perform

_log = logging.getLogger("baton.worker")

MAX_CONNECTIONS = 1024
"""Connections one gate serves at once (a thread each, mostly waiting: every thread of the training process,
its checkpoint writer and its ranks, up to 64, that uses the store holds one); more are closed at once."""
MAX_REFUSALS = 100
"""Calls outside the job's objects one connection may make (each logged) before it is closed."""
CLOSE_WAIT_S = 60.0
"""How long ``close`` waits for calls in flight (an upload of gigabytes, a store's retries)."""

BODY_KINDS = {"put_bytes": ("inline", "fd"), "put_if": ("inline", "fd"), "put_file": ("fd",)}
"""The bodies a request may carry (every other request carries none)."""


class Refused(Exception):
    """The client sent what no honest client sends: its connection is closed."""


class StoreGate:
    """Serves ``store`` for job ``job_id`` on a socket in a directory of its own (0700); ``redact``: the
    worker's redaction of secrets, applied to the job's log chunks."""

    def __init__(self, store: ObjectStore, job_id: str, redact: Optional[Callable[[str], str]] = None):
        self.store, self.job_id = store, check_job_id(job_id)
        self.root = f"{JOBS_PREFIX}{job_id}/"
        self.key = secrets.token_bytes(32)
        self.redact = redact or Redactor()
        self.directory = owned_dirs.make(owned_dirs.GATE_PREFIX)
        self.address = str(self.directory / "store.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reachable(self.address) as path:  # (a long TMPDIR: through the directory's descriptor)
                self._sock.bind(path)
        except OSError as exc:
            self._sock.close()
            owned_dirs.remove(self.directory)
            raise OSError(f"the store gate's socket {self.address}: {exc}") from exc
        self._sock.listen(64)
        self._closed = threading.Event()
        self._conns: set[Connection] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._busy = 0  # calls in flight
        threading.Thread(target=self._accept, name=f"baton-gate-{job_id}", daemon=True).start()

    @property
    def url(self) -> str:
        """What the job's processes open (``open_store``): the socket, the key and the store's own URL."""
        return gate_url(self.address, self.key, self.store.url)

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """Serve nothing more: refuse what arrives, wait up to ``wait_s`` for the calls in flight to land,
        then shut every connection. Closing again does nothing."""
        if self._closed.is_set():
            return
        self._closed.set()
        _shut(self._sock)
        self._sock.close()
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout=wait_s):
                _log.warning("job %s: %d store call(s) of its attempt still in flight %.0f s after it ended",
                             self.job_id, self._busy, wait_s)
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
            except OSError as exc:
                if self._closed.is_set():
                    return
                _log.warning("job %s: its store gate could not accept a connection (%s); it goes on", self.job_id, exc)
                self._closed.wait(0.1)  # (out of descriptors: give the others time to close theirs)
                continue
            conn = Connection(sock.detach())
            with self._lock:
                admitted = not self._closed.is_set() and len(self._conns) < MAX_CONNECTIONS
                if admitted:
                    self._conns.add(conn)
            try:
                if admitted:
                    threading.Thread(target=self._serve, args=(conn,), name=f"baton-gate-{self.job_id}-conn",
                                     daemon=True).start()
                    continue
            except RuntimeError:  # no thread can be started now
                with self._lock:
                    self._conns.discard(conn)
            conn.close()

    def _serve(self, conn: Connection) -> None:
        try:
            if self._handshake(conn):
                refusals = 0
                while not self._closed.is_set():
                    if not self._answer(conn, conn.recv_bytes(FRAME_MAX)):
                        refusals += 1
                        if refusals >= MAX_REFUSALS:
                            raise Refused(f"made {refusals} calls outside its job's objects")
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
        receive_timeout(conn.fileno(), HANDSHAKE_S)  # a connection that never answers holds no thread for long
        conn.send_bytes(challenge)
        answer = conn.recv_bytes(64)
        receive_timeout(conn.fileno(), 0)
        if not secrets.compare_digest(answer, proof(self.key, challenge)):
            return False
        conn.send_bytes(b"ok")
        return True

    # --- one request -----------------------------------------------------------------------------
    def _answer(self, conn: Connection, raw: bytes) -> bool:
        """Answer one request; False if it was refused for reaching outside the job."""
        try:
            request = Request.model_validate_json(raw)
        except ValidationError as exc:
            raise Refused(f"sent a malformed request ({exc.error_count()} errors)") from None
        if request.body not in BODY_KINDS.get(request.op, ("none",)) or (request.dst is None) != (request.op != "copy"):
            raise Refused(f"sent a {request.op} request of the wrong shape")
        body = self._receive_body(conn, request)
        outside = next((k for k in (request.key, request.dst) if k is not None and not within(k, self.root)), None)
        with self._lock:
            serving = not self._closed.is_set()
            self._busy += serving  # until its reply is sent: ``close`` waits for it
        try:
            if outside is not None:
                shown = repr(outside[:200]) + ("..." if len(outside) > 200 else "")
                _log.warning("job %s: refused %s of %s: outside the job's own objects", self.job_id, request.op, shown)
                reply, out = Reply(ok=False, error="OutsideJob", message=str(OutsideJob(
                    f"{request.op} {shown}: a job's processes reach only its own objects ({self.root})"))), None
            elif not serving:
                reply, out = Reply(ok=False, error="StorageUnavailable", message="the attempt's store gate is closed"), None
            else:
                reply, out = perform(self.store, request, body, self.directory, self.redact, self.job_id)
            self._reply(conn, reply, out)
        finally:
            if isinstance(body, int):
                os.close(body)
            if serving:
                with self._idle:
                    self._busy -= 1
                    self._idle.notify_all()
        return outside is None

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

    def _reply(self, conn: Connection, reply: Reply, out: "bytes | int | None") -> None:
        try:
            try:
                frame = reply.model_dump_json().encode()
            except ValueError as exc:  # (a key of the store that is not UTF-8)
                if isinstance(out, int):
                    os.close(out)
                out, frame = None, Reply(ok=False, error="ValueError", message=f"not a reply: {exc}").model_dump_json().encode()
            if len(frame) > INLINE_MAX:  # a long listing: its JSON in a file
                assert out is None
                out = memory_file(json.dumps(reply.value).encode())
                frame = Reply(ok=True, body="fd", value_in_body=True).model_dump_json().encode()
            conn.send_bytes(frame)
            if isinstance(out, bytes):
                conn.send_bytes(out)
            elif isinstance(out, int):
                send_fd(conn, out)
        finally:
            if isinstance(out, int):
                os.close(out)


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
