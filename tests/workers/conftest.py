from __future__ import annotations

from pathlib import Path

import pytest

from schemas.spec import JobSpec
from storage.file_store import FileStore
from workers.control import LoopControl
from workers.session import run_attempt
from tests import probes


class Quiet(LoopControl):
    def log(self, message: str) -> None:
        pass


@pytest.fixture
def run_job(tmp_path):
    """Run a spec (a dict) in this process to the end; returns (result, store root, job id)."""
    counter = iter(range(1000))

    def run(spec: dict, job_id: str | None = None):
        job_id = job_id or f"job{next(counter)}"
        store = FileStore(tmp_path / "store")
        result = run_attempt(JobSpec.parse(spec), job_id, store, 1, Quiet(), allowed_prefixes=("tests",))
        return result, Path(store.root), job_id

    return run


@pytest.fixture(autouse=True)
def clear_probes():
    probes.FORWARDS.clear()
    probes.GRAD_WAS_NONE.clear()
    yield


def read_rows(root: Path, job_id: str) -> list[dict]:
    from storage.file_store import FileStore
    from tests.helpers import metrics_rows

    return metrics_rows(FileStore(root), job_id)
