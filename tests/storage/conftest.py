from __future__ import annotations

import pytest

from storage.file_store import FileStore


@pytest.fixture(params=["file"])
def store(request, tmp_path):
    """Every ObjectStore implementation; the same tests run against each."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    raise AssertionError(request.param)
