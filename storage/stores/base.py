"""The object-store interface every backend implements, and every component uses.

Keys are '/'-separated paths relative to the store's root (``jobs/<id>/manifest.json``).
Missing objects raise FileNotFoundError; unreachable backends raise StorageUnavailable
(after the backend's own retries); refused credentials raise AccessDenied.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Optional


class ObjectStore(ABC):
    url: str

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` to ``key`` atomically: readers see the old object or the new one."""

    @abstractmethod
    def put_file(self, key: str, path: Path, consume: bool = False) -> None:
        """Upload a local file (multipart where the backend needs it), atomically as put_bytes.
        ``consume``: the caller is done with the file, so a local backend may move it into place."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The object's bytes."""

    @abstractmethod
    def get_file(self, key: str, path: Path) -> None:
        """Download to ``path`` (written to a temporary name, then renamed)."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes."""

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys under ``prefix``, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""

    @abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Server-side copy where the backend has one."""

    @abstractmethod
    def read_versioned(self, key: str) -> Optional[tuple[bytes, str]]:
        """``(bytes, version)`` for a later ``put_if``, or None when the object does not exist."""

    @abstractmethod
    def put_if(self, key: str, data: bytes, version: Optional[str]) -> None:
        """Compare-and-swap: write only if ``key`` is still at ``version`` (None: only if it does not
        exist); raise PreconditionFailed otherwise."""

    def scratch_dir(self) -> Optional[Path]:
        """Where to write files that will be ``put_file(consume=True)``: on the objects' own
        filesystem for a local store (a rename instead of a copy), None for a remote one."""
        return None

    def reopen_url(self) -> Optional[str]:
        """A URL ``open_store`` turns into an equivalent store in another process (the checkpoint
        writer's), or None when this object cannot be reproduced from one (a subclass, a client
        configured in code): its work then stays in this process."""
        return None

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True
