"""Step-based runs, validation every N steps, LM schedules, parameter groups, user collate."""
from __future__ import annotations

import math

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from baton.storage.stores.file_store import FileStore
from tests import tasks
from tests.helpers import final_state, make_spec
from tests.workers.conftest import read_rows

BLOBS = {"target": "tests.probes:blobs", "kwargs": {"n": 200}, "batch_size": 32, "val_fraction": 0.25}  # 5 batches/epoch


def _lrs():
    lrs: list[float] = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"]))
    return lrs, handle


def test_a_step_based_run_stops_at_max_steps_and_validates_every_n_and_at_the_end(run_job):
    result, root, job = run_job(make_spec(data=BLOBS, scheduler={"name": "none"},
                                          loop={"epochs": None, "max_steps": 17, "eval_every_steps": 5}))
    rows = read_rows(root, job)
    assert [r["step"] for r in rows] == [5, 10, 15, 17]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]  # 5 batches a pass: step 17 is in the fourth pass
    state = final_state(FileStore(root), job)
    assert state["progress"]["global_step"] == 17 and result.outcome.completed


def test_eval_every_steps_with_epochs_adds_validations_without_doubling_an_epoch_end(run_job):
    _, root, job = run_job(make_spec(data=BLOBS, scheduler={"name": "none"}, loop={"epochs": 2, "eval_every_steps": 5}))
    # steps 5 and 10 are epoch ends (validated there once); 3 would be mid-epoch
    assert [r["step"] for r in read_rows(root, job)] == [5, 10]
    _, root, job = run_job(make_spec(data=BLOBS, scheduler={"name": "none"}, loop={"epochs": 2, "eval_every_steps": 3}))
    assert [r["step"] for r in read_rows(root, job)] == [3, 5, 6, 9, 10]


@pytest.mark.parametrize("name", ["warmup_cosine", "constant_warmup"])
def test_warmup_schedules_step_every_optimizer_step(run_job, name):
    lrs, handle = _lrs()
    try:
        run_job(make_spec(data=BLOBS, optimizer={"name": "adamw", "lr": 0.01},
                          scheduler={"name": name, "warmup_steps": 4, "min_lr_ratio": 0.1},
                          loop={"epochs": None, "max_steps": 20}))
    finally:
        handle.remove()
    expected = []
    for step in range(20):
        if step < 4:
            factor = (step + 1) / 5
        elif name == "constant_warmup":
            factor = 1.0
        else:
            factor = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - 4) / 16))
        expected.append(0.01 * factor)
    assert lrs == pytest.approx(expected, rel=1e-12, abs=0)
    assert lrs[3] == pytest.approx(0.008) and lrs[4] == pytest.approx(0.01)


def test_no_decay_bias_and_norm_puts_vectors_in_a_group_without_weight_decay(run_job):
    _, root, job = run_job(make_spec(data=BLOBS, optimizer={"name": "adamw", "lr": 0.01, "weight_decay": 0.1,
                                                            "no_decay_bias_and_norm": True},
                                     loop={"epochs": 1}, scheduler={"name": "none"}))
    groups = final_state(FileStore(root), job)["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    # the MLP: 3 weight matrices, 3 bias vectors
    assert [len(g["params"]) for g in groups] == [3, 3]


@pytest.mark.parametrize("cycle,beta1_kept", [(True, False), (False, True)])
def test_onecycle_cycles_beta1_only_when_asked(run_job, cycle, beta1_kept):
    _, root, job = run_job(make_spec(data=BLOBS, optimizer={"name": "adamw", "lr": 0.01, "betas": [0.9, 0.95]},
                                     scheduler={"name": "onecycle", "warmup_fraction": 0.3, "cycle_momentum": cycle},
                                     loop={"epochs": 2}))
    betas = final_state(FileStore(root), job)["optimizer"]["param_groups"][0]["betas"]
    assert (tuple(betas) == (0.9, 0.95)) is beta1_kept


def test_a_user_collate_function_builds_the_batches_in_loader_workers(run_job):
    tasks.CALLS.clear()
    result, root, job = run_job(make_spec(
        data={**BLOBS, "num_workers": 2, "collate": {"target": "tests.tasks:pairs_to_dicts", "kwargs": {"scale": 2.0}}},
        task={"target": "tests.tasks:dict_task"}, scheduler={"name": "none"}, loop={"epochs": 1},
        checkpoint={"monitor": "val_f1", "mode": "max"}))
    assert result.outcome.completed and ("loss", True, True) in tasks.CALLS
    assert "val_f1" in read_rows(root, job)[0]


def test_pairs_to_dicts_scales_features():
    batch = tasks.pairs_to_dicts([(torch.ones(2), torch.tensor(1))] * 3, scale=2.0)
    assert torch.equal(batch["features"], torch.full((3, 2), 2.0)) and batch["label"].tolist() == [1, 1, 1]


def test_the_best_weights_are_exported_as_safetensors_beside_the_last(run_job):
    from safetensors.torch import load as load_safetensors

    from baton.storage.artifacts import final_files
    from baton.schemas.manifest import CheckpointManifest
    from tests.helpers import read_manifest

    probe = {"target": "tests.probes:linear", "kwargs": {}}
    diverging = {"target": "tests.probes:diverging", "kwargs": {}, "batch_size": 16, "val_fraction": 0.25}
    _, root, job = run_job(make_spec(model=probe, data=diverging, optimizer={"name": "sgd", "lr": 0.5},
                                     scheduler={"name": "none"}, loop={"epochs": 4}))
    store = FileStore(root)
    manifest = CheckpointManifest.model_validate(read_manifest(store, job))
    files = final_files(manifest)
    best = load_safetensors(store.get_bytes(files["best.safetensors"].key))
    last = load_safetensors(store.get_bytes(files["model.safetensors"].key))
    best_state = torch.load(root / manifest.best.key, weights_only=True)["model"]
    assert best.keys() == best_state.keys() and all(torch.equal(best[k], best_state[k]) for k in best)
    assert any(not torch.equal(best[k], last[k]) for k in best), "the probe makes the last epoch differ from the best"
