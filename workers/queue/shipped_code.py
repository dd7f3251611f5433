"""A worker's copies of the code jobs ship (the spec's ``code``): what their processes import first.

- **Archives.** Fetched from the job's store under its digest, checked against it (a tampered or
  damaged archive is refused, never unpacked: ``CodeRefused``), unpacked once per digest with
  tarfile's ``data`` filter (no absolute paths, no way out of the directory, no devices) and made
  read-only, so that every job of that digest on this worker imports the same files.
- **Packages** (``code.pip``). Each set is resolved against this worker's own environment (pip's
  ``--dry-run --report``: what is installed here, torch and baton included, satisfies it), refused if
  the resolution would replace torch or baton, and what is missing is installed, exactly those
  versions and nothing else (``--no-deps``), into an overlay kept per set.

Both live in one directory this worker process owns (``owned_dirs``: 0700, removed when the worker
stops, swept by the next worker when it was killed). A training process is forked from a forkserver
that never imports a job's code, so one job's modules are never in the next one's process.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Optional

from packaging.utils import canonicalize_name

from baton.schemas.code import PROTECTED, CodeSpec
from baton.schemas.errors import BatonError, PermanentError
from baton.storage import owned_dirs
from baton.storage.layout import code_key
from baton.storage.stores.base import ObjectStore

PREFIX = "baton-code-"
PIP_TIMEOUT_S = 900.0
"""The longest an install of a job's packages may take (a package index that stops answering)."""
OUTPUT_LINES = 15
"""How much of pip's output a failure quotes."""


class CodeRefused(BatonError):
    """The job's archive did not match its digest (tampered with, or damaged) or could not be unpacked
    safely: it is not run here. A loss on this worker, counted (``Ending.CODE``)."""


class PackagesFailed(PermanentError):
    """The job's ``code.pip`` could not be installed (no such version, an index out of reach, a set that
    would replace torch or baton): the job fails, saying why."""


class ShippedCode:
    """This worker's cache of shipped code (module doc)."""

    def __init__(self, directory: Optional[Path] = None):
        self._base: Optional[Path] = directory
        self._root: Optional[Path] = None
        self._lock = threading.Lock()  # (a worker runs one job at a time; a gang follower's fetch may overlap)

    def root(self) -> Path:
        if self._root is None:
            self._root = owned_dirs.make(PREFIX, self._base)
        return self._root

    def close(self) -> None:
        if self._root is not None:
            owned_dirs.remove(self._root)
            self._root = None

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
        target = self.root() / digest.replace(":", "-")
        with self._lock:
            if target.is_dir():
                said.append(f"code {digest}: already unpacked on this worker")
                return target
            started = time.monotonic()
            try:
                data = store.get_bytes(code_key(digest))
            except FileNotFoundError:
                raise PermanentError(f"code {digest}: the store {store.url} no longer holds the job's archive "
                                     f"({code_key(digest)})") from None
            found = f"sha256:{hashlib.sha256(data).hexdigest()}"
            if found != digest:
                raise CodeRefused(f"code {digest}: the archive in the store is {found}: it was changed after "
                                  "submit; refused, not run")
            staging = self.root() / f".{target.name}.partial"
            _remove(staging)
            try:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                    tar.extractall(staging, filter="data")
            except (tarfile.TarError, OSError, EOFError) as exc:
                _remove(staging)
                raise CodeRefused(f"code {digest}: the archive could not be unpacked safely: {exc}") from None
            _read_only(staging)
            os.rename(staging, target)
            said.append(f"code {digest}: fetched and unpacked ({len(data) / 1e6:.1f} MB, "
                        f"{time.monotonic() - started:.1f}s)")
            return target

    def overlay(self, requirements: tuple[str, ...], said: list[str]) -> Path:
        """The overlay holding what ``requirements`` add to this worker's environment, installed the first time."""
        key = hashlib.sha256(json.dumps([sorted(requirements), sys.version, platform.machine()]).encode()).hexdigest()
        target = self.root() / f"pip-{key[:32]}"
        wanted = " ".join(sorted(requirements))
        with self._lock:
            if target.is_dir():
                said.append(f"pip {wanted}: reused the packages installed on this worker for an earlier job")
                return target
            started = time.monotonic()
            staging = self.root() / f".{target.name}.partial"
            _remove(staging)
            staging.mkdir()
            try:
                missing = _resolve(requirements, staging / "report.json")
                (staging / "report.json").unlink()
                if missing:
                    _pip(["install", "--no-deps", "--no-compile", "--target", str(staging),
                          *[f"{name}=={version}" for name, version in missing]], "install")
            except BaseException:
                _remove(staging)
                raise
            _read_only(staging)
            os.rename(staging, target)
            added = ", ".join(f"{name}=={version}" for name, version in missing) or "nothing (all installed here)"
            said.append(f"pip {wanted}: installed {added} ({time.monotonic() - started:.1f}s)")
            return target


def _resolve(requirements: tuple[str, ...], report: Path) -> list[tuple[str, str]]:
    """What installing ``requirements`` into this environment would add or change: (name, version)."""
    _pip(["install", "--dry-run", "--quiet", "--report", str(report),
          *requirements], "resolve")
    installs = json.loads(report.read_text()).get("install", [])
    missing = [(item["metadata"]["name"], item["metadata"]["version"]) for item in installs]
    replaced = [f"{name}=={version}" for name, version in missing if canonicalize_name(name) in PROTECTED]
    if replaced:
        raise PackagesFailed(f"code.pip {' '.join(requirements)}: would replace the worker's own "
                             f"{', '.join(replaced)}; pin versions that the worker's environment satisfies")
    return missing


def _pip(args: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PackagesFailed(f"pip {what} took over {PIP_TIMEOUT_S:.0f}s (is the package index reachable from "
                             "this worker?)") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-OUTPUT_LINES:])
        raise PackagesFailed(f"pip could not {what} the job's packages (exit {done.returncode}):\n{tail}")


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
