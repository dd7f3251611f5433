"""A worker's cache of shipped code: an archive is checked against its digest before anything of it is
unpacked, unpacked read-only once per digest, never outside its directory nor over torch or baton,
made again when a job changed it, and removed with the worker; a package set never replaces what the
worker runs on."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from baton.storage.layout import code_key
from baton.storage.stores.file_store import FileStore
from baton.workers.queue import code_packages
from baton.workers.queue.code_packages import PackagesFailed
from baton.workers.queue.shipped_code import CodeRefused, ShippedCode

from tests.helpers import make_wheel

LIMIT = 10_000_000


def archive(files: dict[str, bytes], links: dict[str, str] | None = None) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    data = buffer.getvalue()
    return data, f"sha256:{hashlib.sha256(data).hexdigest()}"


def stored(tmp_path, files, links=None) -> tuple[FileStore, str]:
    store = FileStore(tmp_path / "store")
    data, digest = archive(files, links)
    store.put_bytes(code_key(digest), data)
    return store, digest


def test_an_archive_is_unpacked_once_read_only_and_removed_with_its_worker(tmp_path):
    store, digest = stored(tmp_path, {"pkg/__init__.py": b"X = 1\n"})
    cache = ShippedCode(LIMIT, tmp_path)
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


def test_an_unpacked_archive_a_job_changed_is_made_again_for_the_next(tmp_path):
    store, digest = stored(tmp_path, {"pkg/__init__.py": b"X = 1\n"})
    cache = ShippedCode(LIMIT, tmp_path)
    where = cache.unpacked(store, digest, [])
    os.chmod(where / "pkg", 0o755)  # what a job running as the worker's user can do
    os.chmod(where / "pkg" / "__init__.py", 0o644)
    (where / "pkg" / "__init__.py").write_text("X = 666\n")
    (where / "pkg" / "extra.py").write_text("")
    said: list[str] = []
    assert cache.unpacked(store, digest, said) == where
    assert "changed on this worker" in said[0], said
    assert (where / "pkg" / "__init__.py").read_text() == "X = 1\n" and not (where / "pkg" / "extra.py").exists()


def test_a_directory_this_worker_did_not_make_is_never_trusted(tmp_path):
    store, digest = stored(tmp_path, {"pkg/__init__.py": b"X = 1\n"})
    cache = ShippedCode(LIMIT, tmp_path)
    planted = cache.root() / digest.replace(":", "-") / "pkg"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("X = 666\n")
    said: list[str] = []
    where = cache.unpacked(store, digest, said)
    assert (where / "pkg" / "__init__.py").read_text() == "X = 1\n" and "fetched and unpacked" in said[0]


def test_an_archive_that_does_not_match_its_digest_is_refused_before_unpacking(tmp_path):
    store = FileStore(tmp_path / "store")
    _, digest = archive({"pkg/__init__.py": b"X = 1\n"})
    other, _ = archive({"pkg/__init__.py": b"import os; os.system('evil')\n"})
    store.put_bytes(code_key(digest), other)
    cache = ShippedCode(LIMIT, tmp_path)
    with pytest.raises(CodeRefused, match="changed after submit"):
        cache.unpacked(store, digest, [])
    assert os.listdir(cache.root()) == []


@pytest.mark.parametrize("files, links, why", [
    ({"../escaped.py": b"X = 1\n"}, None, "not a plain path"),
    ({"/abs/escaped.py": b"X = 1\n"}, None, "not a plain path"),
    ({"pkg/__init__.py": b""}, {"pkg/link": "../../outside"}, "not a regular file"),
    ({"torch/__init__.py": b""}, None, "shadow the worker's own torch"),
    ({"baton.py": b""}, None, "shadow the worker's own baton"),
    ({"big.bin": b"\0" * 2000}, None, "once unpacked"),
])
def test_an_archive_reaching_outside_linking_shadowing_or_too_big_is_refused_whole(tmp_path, files, links, why):
    store, digest = stored(tmp_path, files, links)
    (tmp_path / "base").mkdir()
    cache = ShippedCode(1000, tmp_path / "base")
    with pytest.raises(CodeRefused, match=why):
        cache.unpacked(store, digest, [])
    assert os.listdir(cache.root()) == [] and not list(tmp_path.rglob("escaped.py"))


def test_a_package_set_that_would_replace_an_installed_distribution_is_refused(tmp_path, monkeypatch):
    index = make_wheel(tmp_path / "index", "packaging", "0.1", {"packaging/__init__.py": ""})
    make_wheel(index, "innocent", "1.0", {"torch/__init__.py": "", "innocent.py": ""})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    (tmp_path / "a").mkdir()
    with pytest.raises(PackagesFailed, match="would replace the worker's own packaging"):
        code_packages.install(("packaging==0.1",), tmp_path / "a")
    (tmp_path / "b").mkdir()
    with pytest.raises(PackagesFailed, match="installs module.*torch"):
        code_packages.install(("innocent==1.0",), tmp_path / "b")
