"""A worker's copies of the code jobs ship (the spec's ``code``): what their processes import first.

- **Archives.** Fetched from the job's store under its digest, checked against it (a tampered or
  damaged archive is refused, never unpacked: ``CodeRefused``), then unpacked once per digest
  (``archive``: every member checked, links and paths out refused) and made read-only.
- **Packages** (``code.pip``): installed once per set into an overlay beside the worker's environment,
  never over it (``packages``).

Both live in one directory this worker process owns (``owned_dirs``: removed when the worker
stops, swept by the next worker when it was killed). A training process is forked from a forkserver
that never imports a job's code, so one job's modules are never in the next one's process.

The cache's directory lets others pass but not list, and each entry is its owner's alone until it is
lent, for one attempt, to the job's user (``job_identity``): no job reads another's code. A job whose
processes run as the worker's user (``BATON_JOB_USER=worker``) could change a directory kept for the next: the
worker keeps each one's fingerprint (every file's path and sha256) in its own memory, and checks it
before handing the directory to another job; one that changed is removed and made again.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from baton.schemas.code import CodeSpec
from baton.schemas.errors import BatonError, PermanentError
from baton.storage import owned_dirs
from baton.storage.layout import code_key
from baton.storage.stores.base import ObjectStore

from baton.workers.code import archive as code_archive, packages as code_packages
from baton.workers.code.packages import PackagesUnreachable

PREFIX = "baton-code-"


class CodeRefused(BatonError):
    """The job's archive did not match its digest (tampered with, or damaged), or its packages' index was
    out of this worker's reach: it is not run here. A loss on this worker, counted (``Ending.CODE``). An
    archive, as submitted, that may not be unpacked (a path out, a link, larger than BATON_CODE_LIMIT_MB,
    a header bomb) fails the job instead (``PermanentError``): every worker would refuse it."""


class ShippedCode:
    """This worker's cache of shipped code (module doc)."""

    def __init__(self, limit_bytes: int, directory: Optional[Path] = None):
        self.limit_bytes = limit_bytes
        self._base: Optional[Path] = directory
        self._root: Optional[Path] = None
        self._prints: dict[str, dict[str, str]] = {}  # each kept directory's name -> its fingerprint
        self._lock = threading.Lock()  # (a worker runs one job at a time; a gang follower's fetch may overlap)

    def root(self) -> Path:
        if self._root is None:
            self._root = owned_dirs.make(PREFIX, self._base)
            os.chmod(self._root, 0o711)  # each entry is lent to the job using it alone (``job_identity.grant``)
        return self._root

    def close(self) -> None:
        if self._root is not None:
            owned_dirs.remove(self._root)
            self._root, self._prints = None, {}

    def import_path(self, store: ObjectStore, code: Optional[CodeSpec]) -> tuple[tuple[str, ...], list[str]]:
        """The directories a job's processes put first on their import path, and what was done to have
        them (lines for the job's log)."""
        if code is None:
            return (), []
        if code.dir is not None and code.digest is None:
            raise PermanentError("code.dir was not packed at submit (the spec has no code.digest): submit it with "
                                 "`baton submit --code` or JobClient.submit")
        paths: list[str] = []
        said: list[str] = []
        if code.digest is not None:
            paths.append(str(self.unpacked(store, code.digest, said)))
        if code.pip:
            paths.append(str(self.overlay(code.pip, said)))
        return tuple(paths), said

    def unpacked(self, store: ObjectStore, digest: str, said: list[str]) -> Path:
        """The archive of ``digest``, unpacked here (fetched and checked the first time)."""
        with self._lock:
            target = self.root() / digest.replace(":", "-")
            if self._kept(target, said, f"code {digest}: already unpacked on this worker"):
                return target
            started = time.monotonic()
            key = code_key(digest)
            try:
                if store.size(key) > self.limit_bytes:
                    raise PermanentError(f"code {digest}: the archive is over {self.limit_bytes / 1e6:.0f} MB "
                                         "(BATON_CODE_LIMIT_MB); refused, not run")
                data = store.get_bytes(key)
            except FileNotFoundError:
                raise PermanentError(f"code {digest}: the store {store.url} no longer holds the job's archive "
                                     f"({key})") from None
            found = f"sha256:{hashlib.sha256(data).hexdigest()}"
            if found != digest:
                raise CodeRefused(f"code {digest}: the archive in the store is {found}: it was changed after "
                                  "submit; refused, not run")
            self._make(target, lambda staging: code_archive.unpack(data, staging, self.limit_bytes),
                       f"code {digest}: the archive could not be unpacked safely")
            said.append(f"code {digest}: fetched and unpacked ({len(data) / 1e6:.1f} MB, "
                        f"{time.monotonic() - started:.1f}s)")
            return target

    def overlay(self, requirements: tuple[str, ...], said: list[str]) -> Path:
        """The overlay holding what ``requirements`` add to this worker's environment, installed the first time."""
        key = hashlib.sha256(json.dumps([sorted(requirements), sys.version, platform.machine()]).encode()).hexdigest()
        wanted = " ".join(sorted(requirements))
        with self._lock:
            target = self.root() / f"pip-{key[:32]}"
            if self._kept(target, said, f"pip {wanted}: reused the packages installed on this worker for an earlier job"):
                return target
            started = time.monotonic()
            installed: list[tuple[str, str]] = []

            def install(staging: Path) -> None:
                staging.mkdir()
                installed.extend(code_packages.install(requirements, staging))
            try:
                self._make(target, install, f"pip {wanted}")
            except PackagesUnreachable as exc:
                raise CodeRefused(str(exc)) from None
            added = ", ".join(f"{name}=={version}" for name, version in installed) or "nothing (all installed here)"
            said.append(f"pip {wanted}: installed {added} ({time.monotonic() - started:.1f}s)")
            return target

    def _kept(self, target: Path, said: list[str], reuse: str) -> bool:
        """Whether ``target`` is here as it was made; one that changed since (a job's doing) is removed."""
        expected = self._prints.get(target.name)
        if expected is None:
            _remove(target)  # (none made by this process: nothing to trust)
            return False
        if fingerprint(target) == expected:
            said.append(reuse)
            return True
        said.append(f"{target.name}: changed on this worker since it was made (by an earlier job?): made again")
        del self._prints[target.name]
        _remove(target)
        return False

    def _make(self, target: Path, fill, what: str) -> None:
        """Fill a staging directory (``fill(staging)``), make it read-only, fingerprint it, and move it to
        ``target``; CodeRefused (nothing left) when the archive is refused."""
        staging = self.root() / f".{target.name}.partial"
        _remove(staging)
        try:
            fill(staging)
            _read_only(staging)
            os.chmod(staging, 0o500)  # this user's alone until lent to a job (``job_identity.grant``)
            prints = fingerprint(staging)
            os.rename(staging, target)
        except code_archive.ArchiveRefused as exc:  # the job's own archive, as submitted: the job fails
            _remove(staging)
            raise PermanentError(f"{what}: {exc}; refused, not run") from None
        except OSError as exc:
            _remove(staging)
            raise CodeRefused(f"{what}: {type(exc).__name__}: {exc}") from None
        except BaseException:
            _remove(staging)
            raise
        self._prints[target.name] = prints


def fingerprint(directory: Path) -> dict[str, str]:
    """Every entry under ``directory``: a file's sha256, or what else it is (a directory, a link)."""
    found: dict[str, str] = {}
    for top, dirs, names in os.walk(directory):
        for name in dirs + names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, directory)
            if os.path.islink(path):
                found[rel] = f"link:{os.readlink(path)}"
            elif os.path.isdir(path):
                found[rel] = "dir"
            else:
                with open(path, "rb") as handle:
                    found[rel] = hashlib.file_digest(handle, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
                        else hashlib.sha256(handle.read()).hexdigest()
    return found


def _read_only(directory: Path) -> None:
    """Every file and directory under ``directory`` (itself included) read-only for everyone."""
    for top, dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                os.chmod(path, 0o555 if os.stat(path).st_mode & 0o100 else 0o444)
    for top, dirs, _ in os.walk(directory, topdown=False):
        for name in dirs:
            os.chmod(os.path.join(top, name), 0o555)
    os.chmod(directory, 0o555)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        owned_dirs.remove_tree(path)


def sweep_orphans() -> list[Path]:
    """The caches of workers of this machine that are gone (killed outright), removed."""
    return owned_dirs.remove_orphans(None, (PREFIX,))
