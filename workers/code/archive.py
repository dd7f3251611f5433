"""Unpacking a shipped code archive on a worker, trusting nothing in it but what it is checked against.

The archive's bytes match the job's digest before this is called, but whoever submitted the job made
them: every member is checked first, and one that is not a regular file or a directory with a plain
relative path (no link of any kind, no device, no absolute path, no ``..``), or an archive larger than
the worker's ``BATON_CODE_LIMIT_MB`` once unpacked, or one shipping a top-level ``torch`` or ``baton``,
is refused whole (``ArchiveRefused``) before anything is written. Only then is it extracted, with
tarfile's ``data`` filter on top.

Nothing in it is read unbounded: the gzip stream is decompressed up to ``stream_cap`` bytes (the
unpacked limit, and room for the members' headers) and refused past it, before tarfile reads a header,
so neither a small archive that decompresses to gigabytes nor a header declaring gigabytes of extended
attributes can make the worker read more than that.
"""
from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from baton.schemas.code import PROTECTED

MAX_MEMBERS = 100_000
HEADER_ROOM_BYTES = 32_000_000
"""Room in the decompressed stream for the members' headers, beyond their files' bytes (``stream_cap``)."""


class ArchiveRefused(Exception):
    """What is wrong with an archive (its first problem)."""


def stream_cap(limit_bytes: int) -> int:
    """The most of a decompressed archive a worker reads: its files (``limit_bytes``) padded to tar's blocks,
    and their headers."""
    return 2 * limit_bytes + HEADER_ROOM_BYTES


def unpack(data: bytes, into: Path, limit_bytes: int) -> int:
    """Extract ``data`` (a gzip'd tar) into the new directory ``into``; the files' bytes."""
    stream = decompress(data, stream_cap(limit_bytes))
    try:
        with tarfile.open(fileobj=io.BytesIO(stream), mode="r:") as tar:
            members = tar.getmembers()
            size = check(members, limit_bytes)
            into.mkdir()
            tar.extractall(into, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ArchiveRefused(f"{type(exc).__name__}: {exc}") from None
    return size


def decompress(data: bytes, cap: int) -> bytes:
    """``data`` (gzip) decompressed, refused once past ``cap`` bytes (read no further) or when it is not one
    whole gzip stream."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    out = bytearray()
    pending = data
    try:
        while pending and not inflate.eof:
            out += inflate.decompress(pending, cap + 1 - len(out))
            if len(out) > cap:
                raise ArchiveRefused(f"over {cap / 1e6:.0f} MB once decompressed (BATON_CODE_LIMIT_MB allows "
                                      f"{(cap - HEADER_ROOM_BYTES) / 2e6:.0f} MB of files)")
            pending = inflate.unconsumed_tail
    except zlib.error as exc:
        raise ArchiveRefused(f"not a gzip archive ({exc})") from None
    if not inflate.eof or inflate.unused_data:
        raise ArchiveRefused("not one whole gzip archive (cut short, or followed by other data)")
    return bytes(out)


def check(members: list[tarfile.TarInfo], limit_bytes: int) -> int:
    """The members' total size; ArchiveRefused naming the first member that may not be unpacked."""
    if len(members) > MAX_MEMBERS:
        raise ArchiveRefused(f"{len(members)} entries (at most {MAX_MEMBERS})")
    size = 0
    for member in members:
        path = PurePosixPath(member.name)
        if not (member.isfile() or member.isdir()):
            raise ArchiveRefused(f"{member.name!r} is not a regular file or directory")
        if path.is_absolute() or ".." in path.parts or not member.name or "\\" in member.name:
            raise ArchiveRefused(f"{member.name!r} is not a plain path inside the archive")
        top = path.parts[0] if path.parts else ""
        if top.removesuffix(".py") in PROTECTED and (member.isdir() or len(path.parts) > 1 or top.endswith(".py")):
            raise ArchiveRefused(f"{member.name!r} would shadow the worker's own {top.removesuffix('.py')}")
        size += max(member.size, 0)
        if size > limit_bytes:
            raise ArchiveRefused(f"over {limit_bytes / 1e6:.0f} MB once unpacked (BATON_CODE_LIMIT_MB)")
    return size
