"""What only the S3 backend has: multipart transfers, error translation, URLs."""
from __future__ import annotations

import os

import pytest

from baton.schemas.errors import PermanentError, StorageUnavailable
from baton.storage.stores import s3_store
from baton.storage.stores.open import open_store
from baton.storage.stores.s3_store import S3Store
from tests.netfault import FaultyProxy


def test_large_files_go_multipart_and_round_trip(s3_bucket, tmp_path):
    store = open_store(f"s3://{s3_bucket}")
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(s3_store.MULTIPART_CHUNK_BYTES + 1024))
    store.put_file("big.bin", src)
    etag = store.client.head_object(Bucket=s3_bucket, Key="big.bin")["ETag"]
    assert etag.strip('"').endswith("-2")  # two parts: a multipart upload
    store.get_file("big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    store.delete("big.bin")


@pytest.fixture
def cut_off_store(s3_server, s3_bucket, monkeypatch):
    """An S3Store holding key "k", whose endpoint then becomes unreachable (retries: 1 s)."""
    proxy = FaultyProxy(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    monkeypatch.setattr(s3_store, "RETRY_S", 1.0)
    store = S3Store(s3_bucket)
    store.put_bytes("k", b"v")
    proxy.set("cut")
    yield store
    proxy.close()


def test_unreachable_endpoint_is_storage_unavailable(cut_off_store):
    for call in (lambda: cut_off_store.get_bytes("k"), lambda: cut_off_store.put_bytes("k", b"w"),
                 lambda: cut_off_store.size("k")):
        with pytest.raises(StorageUnavailable):
            call()


def test_missing_bucket_is_a_permanent_error(s3_env):
    with pytest.raises(PermanentError, match="bucket does not exist"):
        open_store("s3://no-such-bucket-here").put_bytes("k", b"v")


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "http://bucket/x", "bucket/x"])
def test_bad_urls_are_refused(url):
    with pytest.raises(ValueError, match="s3://|file://"):
        open_store(url)


def test_prefix_is_kept_apart(s3_bucket):
    a, b = open_store(f"s3://{s3_bucket}/a"), open_store(f"s3://{s3_bucket}/b")
    a.put_bytes("x/1", b"a")
    b.put_bytes("x/1", b"b")
    assert a.list("x/") == ["x/1"] and a.get_bytes("x/1") == b"a" and b.get_bytes("x/1") == b"b"


def test_retries_leave_the_global_python_rng_alone(cut_off_store):
    """Retry jitter drawn from the global ``random`` (botocore's default) would change what a
    training job's own code draws next, and so its result, whenever storage hiccups."""
    import random

    random.seed(1234)
    before = random.getstate()
    with pytest.raises(StorageUnavailable):
        cut_off_store.put_bytes("k", b"w")  # several tries, each failing
    assert random.getstate() == before
