"""What crosses a store gate's socket (``baton.workers.queue.store_gate`` serves it, ``gated.py`` is its
client).

One connection, one thread of the client: a handshake, then requests answered in turn, each a JSON frame
(``multiprocessing.connection``'s length-prefixed frames, never a pickle). A request's body, and a
reply's, is either inline (a frame of bytes, up to ``INLINE_MAX``) or a file descriptor passed with
SCM_RIGHTS: a file the client opened to be uploaded, a file the gate filled to be read. Passing
descriptors keeps a checkpoint of gigabytes out of both processes' memory, and the gate reads only
what the client could open itself (``readable_file``).

The handshake proves the client holds the gate's key, the attempt's own: the gate sends a random
challenge and the client answers with its HMAC.
"""
from __future__ import annotations

import array
import contextlib
import fcntl
import hashlib
import hmac
import os
import re
import socket
import stat
import struct
from multiprocessing.connection import Connection
from typing import Iterator, Literal, Optional
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ConfigDict

from baton.schemas import errors

INLINE_MAX = 1 << 20
"""Bodies up to this many bytes travel in a frame; larger ones as a file descriptor."""
FRAME_MAX = INLINE_MAX + (64 << 10)
"""The largest frame either side reads."""
HANDSHAKE_S = 5.0
"""How long the gate waits for a connection's answer to its challenge."""
CLIENT_HANDSHAKE_S = 30.0
"""How long a client waits for the gate's challenge and its verdict (a gate that accepts and never speaks)."""
_CONTEXT = b"baton store gate v1 "

Op = Literal["put_bytes", "put_file", "get_bytes", "get_file", "size", "list", "delete", "copy",
             "read_versioned", "put_if"]
Body = Literal["none", "inline", "fd"]
ERRORS: dict[str, type[Exception]] = {
    "OutsideJob": errors.OutsideJob, "AccessDenied": errors.AccessDenied, "StoreUnusable": errors.StoreUnusable,
    "PermanentError": errors.PermanentError, "PreconditionFailed": errors.PreconditionFailed,
    "StorageUnavailable": errors.StorageUnavailable, "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError, "NotADirectoryError": NotADirectoryError,
    "FileExistsError": FileExistsError, "ValueError": ValueError}
"""The errors a reply may name, the most particular first: the client raises what the store raised, so that
the callers' retries (``TransientError``) and failures are the same through a gate."""


def error_name(exc: BaseException) -> Optional[str]:
    """The name a reply gives ``exc`` (any other TransientError is StorageUnavailable); None if it has none."""
    if isinstance(exc, errors.TransientError):
        return "StorageUnavailable"
    return next((name for name, kind in ERRORS.items() if isinstance(exc, kind)), None)


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    op: Op
    key: str  # for ``list``, the prefix; for ``copy``, the source
    dst: Optional[str] = None  # ``copy``'s destination
    version: Optional[str] = None  # ``put_if``'s
    body: Body = "none"


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    value: Optional[int | str | list[str]] = None  # ``size``, ``read_versioned``'s version, ``list``
    body: Body = "none"
    value_in_body: bool = False  # a value too long for a frame (a long listing): the body holds its JSON
    error: Optional[str] = None
    message: str = ""


_SEGMENT = re.compile(r"[A-Za-z0-9._=+@%,-]+")


def within(key: str, root: str) -> bool:
    """Whether ``key`` is a plain key under ``root`` (``jobs/<id>/``): '/'-separated segments of safe
    characters, none of them ``.`` or ``..``, at most 1024 characters. ``root`` itself is within."""
    if not (key.startswith(root) and len(key) <= 1024):
        return False
    rest = key[len(root):]
    if rest == "":
        return True
    parts = rest.split("/")
    if parts[-1] == "":  # a prefix ending in '/'
        parts = parts[:-1]
    return all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts)


SUN_PATH_MAX = 107
"""The longest path a Unix socket may be bound or connected to (``sockaddr_un``)."""


@contextlib.contextmanager
def reachable(address: str) -> Iterator[str]:
    """A path to the socket ``address`` that fits ``sockaddr_un``: itself, or, under a long TMPDIR, the same
    file through a descriptor of its directory (``/proc/self/fd/N/name``), held open while it is used."""
    if len(os.fsencode(address)) <= SUN_PATH_MAX:
        yield address
        return
    directory, name = os.path.split(address)
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


def gate_url(address: str, key: bytes, store_url: str) -> str:
    """``gate://<socket>?key=...&url=<the store's own URL>``: what a job's processes open (``GatedStore``)."""
    return f"gate://{quote(address)}?" + urlencode({"key": key.hex(), "url": store_url})


def receive_timeout(fd: int, seconds: float) -> None:
    """SO_RCVTIMEO on the socket ``fd`` (0: none): a read that waits longer fails."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        whole = int(seconds)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def memory_file(data: bytes) -> int:
    """``data`` in an anonymous file (memfd), for a body too large for a frame."""
    fd = os.memfd_create("baton-gate", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(fd: int, limit: Optional[int] = None) -> bytes:
    """The whole file ``fd`` holds (ValueError past ``limit`` bytes)."""
    size = os.fstat(fd).st_size
    if limit is not None and size > limit:
        raise ValueError(f"a body of {size} bytes is over this call's limit of {limit}")
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, 1 << 30), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def proof(key: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, _CONTEXT + challenge, hashlib.sha256).digest()


def send_fd(conn: Connection, fd: int) -> None:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])


def receive_fd(conn: Connection) -> int:
    """The descriptor the other side passed; ValueError if it passed none, or more than one."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        space = socket.CMSG_SPACE(array.array("i").itemsize)
        msg, ancillary, flags, _ = sock.recvmsg(1, space)
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        if msg != b"F" or len(fds) != 1 or flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise ValueError("expected one file descriptor")
        return fds[0]


def readable_file(fd: int) -> None:
    """Refuse a descriptor that is not a regular file opened for reading (a pipe or a device would block
    or never end; an O_PATH descriptor carries no right to read what it names)."""
    mode = fcntl.fcntl(fd, fcntl.F_GETFL)
    if mode & getattr(os, "O_PATH", 0) or (mode & os.O_ACCMODE) not in (os.O_RDONLY, os.O_RDWR):
        raise ValueError("the file descriptor was not opened for reading")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ValueError("the file descriptor is not a regular file")
