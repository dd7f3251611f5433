"""Defect 11: randomness a map-style data set draws in ``__getitem__`` (outside ``augment()``) from
the global RNGs. In loader worker processes baton seeds python's, numpy's and torch's RNGs from
(seed, epoch, index) before each sample, so a mid-epoch resume reproduces it bit for bit and the
result does not depend on how many loader workers there are (as long as there is one)."""
from __future__ import annotations

import pytest

from tests.helpers import (assert_same_training, kill_when, make_spec, mid_epoch_after_two_checkpoints, run_baton,
                           run_reference, start_baton, write_spec)

SPEC = make_spec(data={"target": "tests.noisy_data:noisy_spiral", "kwargs": {"n_per_class": 300}, "num_workers": 2})


@pytest.mark.slow
def test_getitem_randomness_in_loader_workers_resumes_bit_exact(tmp_path):
    spec_path = write_spec(tmp_path, SPEC)
    store = run_reference(tmp_path, SPEC)  # in this process; the cut and resumed runs are `baton run`

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, log=tmp_path / "cut-1.log")
    latest = kill_when(proc, store, "cut", mid_epoch_after_two_checkpoints())["checkpoints"][-1]
    assert latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming cut from step {latest['step']}" in resumed.stdout, resumed.stdout

    assert_same_training(store, "reference", store, "cut")

    run_reference(tmp_path, make_spec(data={**SPEC["data"], "num_workers": 1}), "one-worker")
    assert_same_training(store, "reference", store, "one-worker")  # the same bits with 1 loader worker as with 2
