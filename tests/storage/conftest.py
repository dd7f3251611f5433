from __future__ import annotations

import pytest

from storage.file_store import FileStore
from storage.open import open_store


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path):
    """Every ObjectStore implementation; the same tests run against each (s3: moto over HTTP)."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/some/prefix")
