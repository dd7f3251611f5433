"""G1: a job SIGKILLed mid-epoch and resumed ends bit-identical to one never interrupted."""
from __future__ import annotations

import re

import pytest

from tests.helpers import (assert_same_training, kill_when, make_spec, mid_epoch_after_two_checkpoints, run_baton,
                           run_reference, start_baton, write_spec)

CASES = {
    # dropout, OneCycle (per-step scheduler), gradient accumulation with a partial last group; the data
    # paced (1 ms a sample) so that a step checkpoint stays the latest for a while: 3 steps of a loaded
    # machine's unpaced run could pass between it and the epoch's checkpoint before a poll saw it
    "mlp-dropout-onecycle-accum3": make_spec(loop={"grad_accum_steps": 3},
                                             data={"target": "tests.probes:slow_spiral", "kwargs": {
                                                 "n_per_class": 300, "delay_s": 0.001}}),
    # BatchNorm + Dropout on real data, cosine (per-epoch scheduler), SGD with momentum
    "cnn-batchnorm-digits": make_spec(
        model={"target": "builtin:cnn", "kwargs": {"channels": 8}},
        data={"target": "builtin:digits", "kwargs": {}, "batch_size": 64},
        optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0},
        scheduler={"name": "cosine"},
        loop={"epochs": 2},
    ),
    "bf16-autocast-cpu": make_spec(loop={"precision": "bf16"}),
    # two loader processes and a random per-sample augmentation
    "workers2-augmentation": make_spec(data={"kwargs": {"n_per_class": 300, "jitter": 0.05}, "num_workers": 2}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_mid_epoch_then_resume_is_bit_exact(case, tmp_path):
    spec_path = write_spec(tmp_path, CASES[case])
    store = run_reference(tmp_path, CASES[case])  # in this process; the cut and resumed runs are `baton run`
    url = store.url

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", url, log=tmp_path / "cut-1.log")
    at_kill = kill_when(proc, store, "cut", mid_epoch_after_two_checkpoints())
    latest = at_kill["checkpoints"][-1]
    assert latest["batch_in_epoch"] > 0 and latest["kind"] == "step"

    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", url)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    match = re.search(r"resuming cut from step (\d+) \(epoch (\d+), batch (\d+)\)", resumed.stdout)
    assert match, resumed.stdout
    assert int(match[1]) == latest["step"] and int(match[3]) > 0  # resumed mid-epoch, from what was committed

    assert_same_training(store, "reference", store, "cut")
