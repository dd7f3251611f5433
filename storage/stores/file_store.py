"""``file:///path``: the embedded store, a directory on a local disk.

Writes go to a temporary file in the same directory, are fsynced, then renamed over the key:
a crash leaves the old object or the new one. ``put_if`` serialises writers of a key with an
flock, so it is a real compare-and-swap between processes on one machine.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from baton.schemas.errors import PreconditionFailed, StoreUnusable

from baton.storage.stores.base import ObjectStore

_TMP_PREFIX = ".tmp-"
_LOCK_DIR = ".locks"
_SCRATCH_DIR = ".scratch"


class FileStore(ObjectStore):
    def __init__(self, root: Path | str):
        self.root = Path(root).resolve()
        self.url = f"file://{self.root}"
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700, exist_ok=True)  # (its user's alone: a job's code, as a user of its own, is kept out)
        except OSError as exc:
            raise StoreUnusable(f"{self.url}: the store's directory cannot be created ({exc.strerror or exc})") from exc

    def reopen_url(self) -> Optional[str]:
        return self.url if type(self) is FileStore else None  # a subclass may behave otherwise

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    @contextmanager
    def _temporary(self, final: Path) -> Iterator[Path]:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
        try:
            yield tmp
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._temporary(self._path(key)) as tmp:
            tmp.write_bytes(data)

    def put_file(self, key: str, path: Path, consume: bool = False) -> None:
        with self._temporary(self._path(key)) as tmp:
            if consume:
                try:
                    os.replace(path, tmp)  # same filesystem: no copy
                    return
                except OSError:
                    pass
            shutil.copyfile(path, tmp)

    def scratch_dir(self) -> Path:
        scratch = self.root / _SCRATCH_DIR
        scratch.mkdir(exist_ok=True)
        return scratch

    def get_bytes(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def get_file(self, key: str, path: Path) -> None:
        src = self._path(key)
        if not src.is_file():
            raise FileNotFoundError(key)
        path = Path(path)
        tmp = path.with_name(path.name + f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(key)
        return path.stat().st_size

    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix``: the walk starts at the prefix's own folder, not the store's root (a
        checkpoint's garbage collection lists its job's attempts, never every job's files)."""
        folder, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        if folder and any(p in ("", ".", "..") or p.startswith(".") for p in folder.split("/")):
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                key = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def copy(self, src: str, dst: str) -> None:
        source = self._path(src)
        if not source.is_file():
            raise FileNotFoundError(src)
        self.put_file(dst, source)

    @contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        lock_dir = self.root / _LOCK_DIR
        lock_dir.mkdir(exist_ok=True)
        lock = lock_dir / hashlib.sha256(key.encode()).hexdigest()
        with open(lock, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @staticmethod
    def _version(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def read_versioned(self, key: str) -> Optional[tuple[bytes, str]]:
        try:
            data = self.get_bytes(key)
        except FileNotFoundError:
            return None
        return data, self._version(data)

    def put_if(self, key: str, data: bytes, version: Optional[str]) -> None:
        with self._locked(key):
            current = self.read_versioned(key)
            current_version = current[1] if current else None
            if current_version != version:
                raise PreconditionFailed(f"{key} changed since it was read")
            self.put_bytes(key, data)
