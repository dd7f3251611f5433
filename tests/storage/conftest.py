from __future__ import annotations

import pytest

from baton.storage.stores.file_store import FileStore
from baton.storage.stores.open import open_store


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    """Every ObjectStore implementation; the same tests run against each (s3: moto over HTTP)."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/some/prefix")


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
