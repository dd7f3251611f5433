from __future__ import annotations

import pytest

from baton.storage.stores.base import ObjectStore
from baton.storage.stores.file_store import FileStore
from baton.storage.stores.open import open_store


@pytest.fixture(params=["file", "s3", "gate-file", "gate-s3"])
def store(request, tmp_path):
    """Every ObjectStore implementation; the same tests run against each (s3: moto over HTTP; gate-*: a
    job's view of that store through its worker's store gate, the keys under the job's own root)."""
    kind = request.param.removeprefix("gate-")
    if kind == "file":
        backend = FileStore(tmp_path / "store")
    else:
        backend = open_store(f"s3://{request.getfixturevalue('s3_bucket')}/some/prefix")
    if not request.param.startswith("gate-"):
        return backend
    from baton.workers.queue.store_gate import StoreGate

    gate = StoreGate(backend, "contract")
    request.addfinalizer(gate.close)
    return UnderJob(open_store(gate.url), "jobs/contract/")


class UnderJob(ObjectStore):
    """``store`` seen from ``root``: each key given is under it, each key listed is given back without it
    (the contract's keys are the store's own; a gated store serves one job's)."""

    def __init__(self, store: ObjectStore, root: str):
        self.inner, self.root, self.url = store, root, store.url

    def put_bytes(self, key, data):
        self.inner.put_bytes(self.root + key, data)

    def put_file(self, key, path, consume=False):
        self.inner.put_file(self.root + key, path, consume)

    def get_bytes(self, key):
        return self.inner.get_bytes(self.root + key)

    def get_file(self, key, path):
        self.inner.get_file(self.root + key, path)

    def size(self, key):
        return self.inner.size(self.root + key)

    def list(self, prefix):
        return [key[len(self.root):] for key in self.inner.list(self.root + prefix)]

    def delete(self, key):
        self.inner.delete(self.root + key)

    def copy(self, src, dst):
        self.inner.copy(self.root + src, self.root + dst)

    def read_versioned(self, key):
        return self.inner.read_versioned(self.root + key)

    def put_if(self, key, data, version):
        self.inner.put_if(self.root + key, data, version)

    def scratch_dir(self):
        return self.inner.scratch_dir()


@pytest.fixture
def gateway(s3_server):
    """An HTTP gateway in front of the test S3 endpoint that can hold requests (tests/s3_gateway.py)."""
    from tests.s3_gateway import S3Gateway

    gw = S3Gateway(s3_server.port)
    yield gw
    gw.close()


def store_through(gateway, bucket: str, prefix: str = "runs"):
    """An S3 store on ``bucket/prefix`` whose requests pass through ``gateway``."""
    import boto3
    from botocore.config import Config

    from baton.storage.stores.s3_store import S3Store

    client = boto3.client("s3", endpoint_url=gateway.endpoint_url,
                          config=Config(retries={"mode": "standard", "total_max_attempts": 1}))
    return S3Store(bucket, prefix, client=client)
