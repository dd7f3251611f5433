"""Unpacking a shipped code archive on a worker, trusting nothing in it but what it is checked against.

The archive's bytes match the job's digest before this is called, but whoever submitted the job made
them: every member is checked first, and one that is not a regular file or a directory with a plain
relative path (no link of any kind, no device, no absolute path, no ``..``), or an archive larger than
the worker's ``BATON_CODE_LIMIT_MB`` once unpacked, or one shipping a top-level ``torch`` or ``baton``,
is refused whole (``ArchiveRefused``) before anything is written. Only then is it extracted, with
tarfile's ``data`` filter on top.

Nothing in it is read unbounded: the gzip stream is decompressed, a megabyte at a time, into a file of the
worker's (not its memory) up to ``stream_cap`` bytes (the unpacked limit, and room for the members'
headers) and refused past it; then its headers alone are walked, and the extended ones (PAX records, long
names) refused past ``HEADER_ROOM_BYTES`` in all, before tarfile parses any. Neither a small archive that
decompresses to gigabytes nor headers declaring gigabytes of attributes make the worker read, hold or
parse more than that.
"""
from __future__ import annotations

import tarfile
import tempfile
import zlib
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from baton.schemas.code import PROTECTED
from baton.storage import plain_tar

MAX_MEMBERS = 100_000
HEADER_ROOM_BYTES = 32_000_000
"""Room in the decompressed stream for the members' headers, beyond their files' bytes (``stream_cap``), and
the most its extended headers (PAX records, long names) may hold in all."""


class ArchiveRefused(Exception):
    """What is wrong with an archive (its first problem)."""


def stream_cap(limit_bytes: int) -> int:
    """The most of a decompressed archive a worker reads: its files (``limit_bytes``) padded to tar's blocks,
    and their headers."""
    return 2 * limit_bytes + HEADER_ROOM_BYTES


def unpack(data: bytes, into: Path, limit_bytes: int) -> int:
    """Extract ``data`` (a gzip'd tar) into the new directory ``into`` (its decompressed stream held in a
    file beside it, gone with it); the files' bytes."""
    with tempfile.TemporaryFile(dir=into.parent, prefix=".stream-") as stream:
        decompress(data, stream, stream_cap(limit_bytes))
        check_headers(stream, HEADER_ROOM_BYTES)
        stream.seek(0)
        try:
            with tarfile.open(fileobj=stream, mode="r:") as tar:
                members = tar.getmembers()
                size = check(members, limit_bytes)
                into.mkdir()
                plain_tar.extract(tar, into, members)  # (tarfile's data filter: the same rules again)
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            raise ArchiveRefused(f"{type(exc).__name__}: {exc}") from None
    return size


CHUNK_BYTES = 1 << 20
"""What decompression writes at a time (all it holds in memory)."""


def decompress(data: bytes, out: BinaryIO, cap: int) -> None:
    """``data`` (gzip) decompressed into ``out``, refused once past ``cap`` bytes (decompressing no further)
    or when it is not one whole gzip stream."""
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    written, pending = 0, data
    try:
        while pending and not inflate.eof:
            chunk = inflate.decompress(pending, min(CHUNK_BYTES, cap + 1 - written))
            written += len(chunk)
            if written > cap:
                raise ArchiveRefused(f"over {cap / 1e6:.0f} MB once decompressed (BATON_CODE_LIMIT_MB allows "
                                      f"{(cap - HEADER_ROOM_BYTES) / 2e6:.0f} MB of files)")
            out.write(chunk)
            pending = inflate.unconsumed_tail
    except zlib.error as exc:
        raise ArchiveRefused(f"not a gzip archive ({exc})") from None
    if not inflate.eof or inflate.unused_data:
        raise ArchiveRefused("not one whole gzip archive (cut short, or followed by other data)")


EXTENDED = (b"x", b"g", b"L", b"K")
"""Tar's header entries that hold metadata for the next member (PAX records, GNU long names and links)."""


def check_headers(stream: BinaryIO, room: int) -> None:
    """Walk the tar ``stream``'s headers, a block each, skipping the members' bytes; ArchiveRefused once its
    extended headers hold more than ``room`` bytes in all (tarfile would parse every one of them)."""
    stream.seek(0)
    held = offset = 0
    while True:
        stream.seek(offset)
        block = stream.read(512)
        if len(block) < 512 or block == bytes(512):
            return
        field = block[124:136]
        try:
            size = int.from_bytes(field[1:], "big") if field[0] & 0x80 else int(field.strip(b"\0 ") or b"0", 8)
        except ValueError:
            return  # (not a header tarfile can read: it says so)
        if block[156:157] in EXTENDED:
            held += size
            if held > room:
                raise ArchiveRefused(f"its extended headers hold over {room / 1e6:.0f} MB (PAX records, long names)")
        offset += 512 + (size + 511) // 512 * 512


def check(members: list[tarfile.TarInfo], limit_bytes: int) -> int:
    """The members' total size; ArchiveRefused naming the first member that may not be unpacked."""
    if len(members) > MAX_MEMBERS:
        raise ArchiveRefused(f"{len(members)} entries (at most {MAX_MEMBERS})")
    size = 0
    for member in members:
        path = PurePosixPath(member.name)
        why = plain_tar.unsafe(member)
        if why is not None:
            raise ArchiveRefused(why)
        top = path.parts[0] if path.parts else ""
        if top.removesuffix(".py") in PROTECTED and (member.isdir() or len(path.parts) > 1 or top.endswith(".py")):
            raise ArchiveRefused(f"{member.name!r} would shadow the worker's own {top.removesuffix('.py')}")
        size += max(member.size, 0)
        if size > limit_bytes:
            raise ArchiveRefused(f"over {limit_bytes / 1e6:.0f} MB once unpacked (BATON_CODE_LIMIT_MB)")
    return size
