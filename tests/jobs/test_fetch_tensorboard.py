"""`baton fetch JOB --which tensorboard`: every attempt's event files, read back by TensorBoard's own
reader, hold the job's validation rows."""
from __future__ import annotations

import numpy as np
import pytest

from baton.storage.stores.file_store import FileStore
from tests.helpers import make_spec, metrics_rows, run_baton, write_spec

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


@pytest.mark.slow
def test_fetch_brings_the_event_files_of_a_job(tmp_path):
    store_url = f"file://{tmp_path / 'store'}"
    spec = write_spec(tmp_path, make_spec(loop={"epochs": 2}))
    done = run_baton("run", str(spec), "--id", "tb", "--storage", store_url)
    assert done.returncode == 0, done.stderr
    fetched = run_baton("fetch", "tb", "--which", "tensorboard", "--storage", store_url, "-o", str(tmp_path / "out"))
    assert fetched.returncode == 0, fetched.stderr
    [attempt] = (tmp_path / "out" / "tb" / "tensorboard").iterdir()
    assert attempt.name == "attempt-1" and len(list(attempt.iterdir())) == 1
    reader = event_accumulator.EventAccumulator(str(attempt))
    reader.Reload()
    rows = metrics_rows(FileStore(tmp_path / "store"), "tb")
    assert [(e.step, e.value) for e in reader.Scalars("val_loss")] == \
        [(r["step"], float(np.float32(r["val_loss"]))) for r in rows]

