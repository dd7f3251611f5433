"""A tar archive's members unpacked as plain files and directories only, on every Python baton runs on.

Each member must be a regular file or a directory, with a plain relative path (no link of any kind, no
device, no absolute path, no ``..``), or the whole archive is refused (``UnsafeMember``) before anything is
written. Then tarfile's ``data`` filter extracts it where Python has one (3.11.4+, 3.12+); where it has none
(Debian 12's 3.11.2), owners become this process's and modes lose what the filter drops (set-id bits,
others' write), as it would: a root process gives no file the archive's owner.
"""
from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import Optional, Sequence


class UnsafeMember(tarfile.TarError):
    """A member that is not a plain file or directory inside the archive (its name said)."""


def unsafe(member: tarfile.TarInfo) -> Optional[str]:
    """Why ``member`` may not be unpacked, or None."""
    path = PurePosixPath(member.name)
    if not (member.isfile() or member.isdir()):
        return f"{member.name!r} is not a regular file or directory"
    if path.is_absolute() or ".." in path.parts or not member.name or "\\" in member.name:
        return f"{member.name!r} is not a plain path inside the archive"
    return None


def extract(tar: tarfile.TarFile, into: Path, members: Optional[Sequence[tarfile.TarInfo]] = None) -> None:
    """``members`` (all of the archive's if None) into the directory ``into``; ``UnsafeMember`` (nothing
    written) for the first that is not a plain file or directory inside it, a link included."""
    members = list(tar.getmembers() if members is None else members)
    for member in members:
        why = unsafe(member)
        if why is not None:
            raise UnsafeMember(why)
    if hasattr(tarfile, "data_filter"):
        tar.extractall(into, members=members, filter="data")
        return
    for member in members:
        member.uid, member.gid, member.uname, member.gname = os.geteuid(), os.getegid(), "", ""
        member.mode &= 0o755
    tar.extractall(into, members=members)
