"""A worker's cache of shipped code: an archive is checked against its digest before anything of it is
unpacked, unpacked read-only once per digest, never outside its directory nor over torch or baton,
made again when a job changed it, and removed with the worker; a package set never replaces what the
worker runs on."""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile

import pytest

from baton.storage.layout import code_key
from baton.storage.stores.file_store import FileStore
from baton.schemas.errors import PermanentError
from baton.workers.code import packages as code_packages
from baton.workers.code.archive import CHUNK_BYTES, stream_cap
from baton.workers.code.cache import CodeRefused, ShippedCode
from baton.workers.code.packages import PackagesFailed

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


@pytest.mark.parametrize("files, links, why, refused", [
    ({"../escaped.py": b"X = 1\n"}, None, "not a plain path", PermanentError),
    ({"/abs/escaped.py": b"X = 1\n"}, None, "not a plain path", PermanentError),
    ({"pkg/__init__.py": b""}, {"pkg/link": "../../outside"}, "not a regular file", PermanentError),
    ({"torch/__init__.py": b""}, None, "shadow the worker's own torch", PermanentError),
    ({"baton.py": b""}, None, "shadow the worker's own baton", PermanentError),
    ({"big.bin": b"\0" * 2000}, None, "once unpacked", PermanentError),
])
def test_an_archive_reaching_outside_linking_shadowing_or_too_big_is_refused_whole(tmp_path, files, links, why,
                                                                                    refused):
    store, digest = stored(tmp_path, files, links)
    (tmp_path / "base").mkdir()
    cache = ShippedCode(1000, tmp_path / "base")
    with pytest.raises(refused, match=why):
        cache.unpacked(store, digest, [])
    assert os.listdir(cache.root()) == [] and not list(tmp_path.rglob("escaped.py"))


def header_bomb(declared: int) -> bytes:
    """A small gzip'd tar whose first member is a PAX header declaring ``declared`` bytes of attributes
    (zeros: they compress ~1000:1), followed by that many."""
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, declared
    block = header.tobuf(format=tarfile.USTAR_FORMAT)
    zipped = io.BytesIO()
    with gzip.GzipFile(fileobj=zipped, mode="wb", compresslevel=9) as out:
        out.write(block)
        zero = b"\0" * (1 << 20)
        for _ in range(declared >> 20):
            out.write(zero)
    return zipped.getvalue()


def test_an_archive_whose_header_declares_gigabytes_is_refused_without_reading_them(tmp_path):
    """256 MiB of PAX header in a quarter-megabyte archive (a user's was 1.5 GiB in 1.5 MB): refused, having
    decompressed at most the worker's bound (here 10 MB of files: 52 MB of stream), never the whole header."""
    import tracemalloc

    data = header_bomb(1 << 28)
    assert len(data) < 400_000
    store = FileStore(tmp_path / "store")
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    store.put_bytes(code_key(digest), data)
    cache = ShippedCode(LIMIT, tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(PermanentError, match="once decompressed"):
            cache.unpacked(store, digest, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * CHUNK_BYTES, peak  # (tarfile read the whole header: a user's took 2 GB of RSS)
    assert os.listdir(cache.root()) == []


def test_extended_headers_past_their_room_are_refused_before_tarfile_parses_them(tmp_path):
    """40 MB of PAX records in a small archive, under the stream's bound (100 MB of files allowed): tarfile
    would spend tens of seconds of a core parsing them; the header walk refuses them first."""
    data = header_bomb(40 << 20)
    store = FileStore(tmp_path / "store")
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    store.put_bytes(code_key(digest), data)
    assert stream_cap(100_000_000) > 40 << 20
    with pytest.raises(PermanentError, match="extended headers hold over 32 MB"):
        ShippedCode(100_000_000, tmp_path).unpacked(store, digest, [])


@pytest.mark.parametrize("data, why", [(b"not gzip at all", "not a gzip archive"),
                                        (gzip.compress(b"\0" * 1024, mtime=0)[:-8], "not one whole gzip archive"),
                                        (gzip.compress(b"x" * 600, mtime=0), "ReadError")],
                         ids=["not-gzip", "cut-short", "not-a-tar"])
def test_an_archive_that_is_not_a_whole_gzip_tar_fails_the_job_in_one_line(tmp_path, data, why):
    store = FileStore(tmp_path / "store")
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    store.put_bytes(code_key(digest), data)
    with pytest.raises(PermanentError, match=why) as refused:
        ShippedCode(LIMIT, tmp_path).unpacked(store, digest, [])
    assert "\n" not in str(refused.value)


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
    make_wheel(index, "stdlibby", "1.0", {"csv.py": "", "stdlibby.py": ""})  # (Python's own csv, hidden)
    (tmp_path / "c").mkdir()
    with pytest.raises(PackagesFailed, match=r"installs module\(s\) csv, which"):
        code_packages.install(("stdlibby==1.0",), tmp_path / "c")


@pytest.mark.slow
def test_a_namespace_package_merges_with_the_workers_and_only_what_would_hide_its_own_is_refused(tmp_path,
                                                                                                   monkeypatch):
    """The worker's environment has the namespace package ``google`` (protobuf, google-auth): a package
    adding ``google.nsdemo`` (as googleapis-common-protos adds ``google.api``) is installed beside it; one
    shipping its own ``google.protobuf`` is refused, naming it."""
    pytest.importorskip("google.protobuf")
    index = make_wheel(tmp_path / "index", "nsdemo", "1.0", {"google/nsdemo/__init__.py": "X = 1\n"})
    make_wheel(index, "fakeproto", "1.0", {"google/protobuf/__init__.py": "", "google/fakeproto.py": ""})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    (tmp_path / "a").mkdir()
    assert code_packages.install(("nsdemo==1.0",), tmp_path / "a") == [("nsdemo", "1.0")]
    assert (tmp_path / "a" / "google" / "nsdemo" / "__init__.py").exists()
    (tmp_path / "b").mkdir()
    with pytest.raises(PackagesFailed, match=r"installs module\(s\) google\.protobuf, which") as refused:
        code_packages.install(("fakeproto==1.0",), tmp_path / "b")
    assert "google.fakeproto" not in str(refused.value)
