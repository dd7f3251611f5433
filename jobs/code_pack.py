"""Packing a directory of the user's code into an archive that is the same bytes whenever the files are.

What goes in: every regular file under the directory, except version control (``.git``, ``.hg``,
``.svn``), caches (``__pycache__``, ``*.pyc``, tool caches), virtual environments (any directory with a
``pyvenv.cfg``, ``.venv``, ``.tox``, ``.nox``), ``baton-data`` (``baton run``'s default store), what the directory's ``.gitignore`` files name (each
applies below its own directory, as git reads them) and the spec's ``code.exclude`` patterns. A
symlink to a file goes in as the file it names; a symlinked directory is left out (it may lead
anywhere, even back up the tree), and a link to a file outside the directory is refused (it could ship
a file you never meant to, a credential).

The archive is a gzip'd tar whose entries are sorted by path, with no times, owners or modes beyond
the executable bit: its sha256 (the digest a job runs under) depends only on the files' paths and
contents. Pure file work: nothing is uploaded here (``code_ship``).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pathspec

from baton.schemas.code import PROTECTED
from baton.schemas.errors import SpecError

SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", ".eggs", "baton-data"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")
LARGEST_SHOWN = 5


@dataclass(frozen=True)
class Packed:
    """An archive of a directory: its bytes, its digest (``sha256:<hex>``), and what it holds."""

    data: bytes
    digest: str
    files: int
    size: int  # the files' bytes, before compression
    tops: frozenset[str] = frozenset()  # the importable names at its top (packages, and modules without ".py")


def pack(directory: Path, exclude: Sequence[str] = (), limit_bytes: Optional[int] = None) -> Packed:
    """The archive of ``directory`` (module doc). SpecError (naming ``code.dir``) when it is not a
    directory, holds nothing to ship, or holds more than ``limit_bytes`` (the largest files named)."""
    root = Path(directory)
    if not root.is_dir():
        raise SpecError([f"code.dir: {root} is not a directory"])
    files = sorted(_files(root, exclude))
    if not files:
        raise SpecError([f"code.dir: {root} holds no file to ship (after its exclusions)"])
    shadowing = sorted({rel.split("/")[0] for rel, _, _ in files
                        if rel.split("/")[0].removesuffix(".py") in PROTECTED and (rel.endswith(".py") or "/" in rel)})
    if shadowing:
        raise SpecError([f"code.dir: {root} holds {', '.join(shadowing)}, which would shadow the worker's own "
                         f"{', '.join(name.removesuffix('.py') for name in shadowing)}; leave it out (code.exclude)"])
    size = sum(file_size for _, _, file_size in files)
    if limit_bytes is not None and size > limit_bytes:
        largest = sorted(files, key=lambda entry: -entry[2])[:LARGEST_SHOWN]
        named = ", ".join(f"{rel} ({file_size / 1e6:.1f} MB)" for rel, _, file_size in largest)
        raise SpecError([f"code.dir: {root} holds {size / 1e6:.1f} MB to ship, over the limit of "
                         f"{limit_bytes / 1e6:.0f} MB (BATON_CODE_LIMIT_MB); the largest: {named}. Leave data and "
                         "weights out (code.exclude, or .gitignore) and read them from storage"])
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=1) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, path, file_size in files:
                info = tarfile.TarInfo(rel)
                info.size = file_size
                info.mode = 0o755 if os.stat(path).st_mode & stat.S_IXUSR else 0o644
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
    data = buffer.getvalue()
    tops = frozenset(rel.split("/")[0] if "/" in rel else rel.removesuffix(".py") for rel, _, _ in files)
    return Packed(data, f"sha256:{hashlib.sha256(data).hexdigest()}", len(files), size, tops)


def _files(root: Path, exclude: Sequence[str]) -> Iterator[tuple[str, Path, int]]:
    """``(path relative to root, path, size)`` of every file that goes in."""
    excluded = pathspec.GitIgnoreSpec.from_lines(exclude)
    ignores: list[tuple[str, pathspec.GitIgnoreSpec]] = []  # (directory relative to root, its .gitignore)
    for top, dirs, names in os.walk(root):
        here = Path(top)
        rel_top = here.relative_to(root).as_posix()
        rel_top = "" if rel_top == "." else rel_top + "/"
        if (here / ".gitignore").is_file():
            ignores.append((rel_top, pathspec.GitIgnoreSpec.from_lines((here / ".gitignore").read_text().splitlines())))
        keep = []
        for name in sorted(dirs):
            path = here / name
            if name in SKIPPED_DIRS or path.is_symlink() or (path / "pyvenv.cfg").exists() or \
                    _ignored(rel_top + name + "/", excluded, ignores):
                continue
            keep.append(name)
        dirs[:] = keep
        for name in sorted(names):
            rel, path = rel_top + name, here / name
            if name.endswith(SKIPPED_SUFFIXES) or not path.is_file() or _ignored(rel, excluded, ignores):
                continue  # (not a regular file, nor a link to one: a socket, a dangling link)
            if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
                raise SpecError([f"code.dir: {rel} links to {path.resolve()}, outside {root}: links are shipped as "
                                 "the files they name, so copy it in or leave it out (code.exclude)"])
            yield rel, path, path.stat().st_size


def _ignored(rel: str, excluded: pathspec.GitIgnoreSpec, ignores: list[tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
    """Whether ``rel`` (a directory ends with "/") is excluded, or named by a .gitignore above it (the
    deepest one that says anything of it decides, as in git)."""
    if excluded.match_file(rel):
        return True
    for base, spec in reversed(ignores):
        if rel.startswith(base):
            result = spec.check_file(rel[len(base):])
            if result.include is not None:
                return bool(result.include)
    return False
