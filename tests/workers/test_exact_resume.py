"""G1: a job SIGKILLed mid-epoch and resumed ends bit-identical to one never interrupted."""
from __future__ import annotations

import re

import pytest

from schemas.metrics import DETERMINISTIC_FIELDS
from tests.helpers import (assert_bit_equal, final_state, kill_when, make_spec, metrics_rows, run_baton,
                           start_baton, write_spec)

CASES = {
    # dropout, OneCycle (per-step scheduler), gradient accumulation with a partial last group
    "mlp-dropout-onecycle-accum3": make_spec(loop={"grad_accum_steps": 3}),
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


def _mid_epoch_after_two(seen: set) -> callable:
    def ready(manifest: dict) -> bool:
        seen.update(e["step"] for e in manifest["checkpoints"] if e["kind"] == "step")
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return len(seen) >= 2 and latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    return ready


@pytest.mark.parametrize("case", list(CASES))
def test_sigkill_mid_epoch_then_resume_is_bit_exact(case, tmp_path):
    spec_path = write_spec(tmp_path, CASES[case])
    store = tmp_path / "store"
    url = f"file://{store}"

    reference = run_baton("run", str(spec_path), "--id", "reference", "--storage", url)
    assert reference.returncode == 0, reference.stdout + reference.stderr

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", url, log=tmp_path / "cut-1.log")
    at_kill = kill_when(proc, store, "cut", _mid_epoch_after_two(set()))
    latest = at_kill["checkpoints"][-1]
    assert latest["batch_in_epoch"] > 0 and latest["kind"] == "step"

    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", url)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    match = re.search(r"resuming cut from step (\d+) \(epoch (\d+), batch (\d+)\)", resumed.stdout)
    assert match, resumed.stdout
    assert int(match[1]) == latest["step"] and int(match[3]) > 0  # resumed mid-epoch, from what was committed

    ref, cut = final_state(store, "reference"), final_state(store, "cut")
    for part in ("model", "optimizer", "scheduler", "scaler", "progress", "best", "rng"):
        assert_bit_equal(ref[part], cut[part], part)
    ref_rows, cut_rows = metrics_rows(store, "reference"), metrics_rows(store, "cut")
    assert [{k: r[k] for k in DETERMINISTIC_FIELDS} for r in ref_rows] == \
           [{k: r[k] for k in DETERMINISTIC_FIELDS} for r in cut_rows]
    assert (store / "jobs/reference/final/model.safetensors").read_bytes() == \
           (store / "jobs/cut/final/model.safetensors").read_bytes()
