"""A worker's cache of shipped code: an archive is checked against its digest before anything of it is
unpacked, unpacked read-only once per digest, never outside its directory, and removed with the worker."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from baton.storage.layout import code_key
from baton.storage.stores.file_store import FileStore
from baton.workers.queue.shipped_code import CodeRefused, ShippedCode


def archive(files: dict[str, bytes]) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    return data, f"sha256:{hashlib.sha256(data).hexdigest()}"


def test_an_archive_is_unpacked_once_read_only_and_removed_with_its_worker(tmp_path):
    store = FileStore(tmp_path / "store")
    data, digest = archive({"pkg/__init__.py": b"X = 1\n"})
    store.put_bytes(code_key(digest), data)
    cache = ShippedCode(tmp_path)
    said: list[str] = []
    where = cache.unpacked(store, digest, said)
    assert (where / "pkg" / "__init__.py").read_bytes() == b"X = 1\n"
    for path in [where, where / "pkg", where / "pkg" / "__init__.py"]:
        assert path.stat().st_mode & 0o222 == 0, path  # read-only for everyone (root aside)
    store.delete(code_key(digest))
    assert cache.unpacked(store, digest, said) == where and "already unpacked" in said[-1]
    root = cache.root()
    cache.close()
    assert not root.exists()


def test_an_archive_that_does_not_match_its_digest_is_refused_before_unpacking(tmp_path):
    store = FileStore(tmp_path / "store")
    _, digest = archive({"pkg/__init__.py": b"X = 1\n"})
    other, _ = archive({"pkg/__init__.py": b"import os; os.system('evil')\n"})
    store.put_bytes(code_key(digest), other)
    cache = ShippedCode(tmp_path)
    with pytest.raises(CodeRefused, match="changed after submit"):
        cache.unpacked(store, digest, [])
    assert os.listdir(cache.root()) == []


def test_an_archive_reaching_outside_its_directory_is_refused(tmp_path):
    store = FileStore(tmp_path / "store")
    data, digest = archive({"../escaped.py": b"X = 1\n"})
    store.put_bytes(code_key(digest), data)
    cache = ShippedCode(tmp_path / "cache-base")
    (tmp_path / "cache-base").mkdir()
    with pytest.raises(CodeRefused, match="could not be unpacked safely"):
        cache.unpacked(store, digest, [])
    assert not list(tmp_path.rglob("escaped.py"))
