"""One test per rule of DESIGN "The loop"; each fails when its rule is broken."""
from __future__ import annotations

import math
import re

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, OneCycleLR
from torch.optim.optimizer import register_optimizer_step_post_hook

from baton.schemas.errors import NonFiniteLossError
from baton.schemas.spec import JobSpec, TaskSpec
from baton.storage.checkpoint_io import load_bytes, rows_of
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.workers.training.amp import Precision, optimizer_step
from baton.workers.training.components import build_components
from baton.workers.training.data import split_indices
from baton.workers.training.evaluate import evaluate
from baton.workers.training.targets import build_task
from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt

from tests import probes
from tests.helpers import final_state, make_spec
from tests.workers.conftest import Quiet, read_rows

RECORDING = {"target": "tests.probes:recording_mlp", "kwargs": {"hidden": 16, "dropout": 0.1}}
BLOBS = {"target": "tests.probes:blobs", "kwargs": {"n": 200}, "batch_size": 32, "val_fraction": 0.25}


def spec(**sections):
    """A small job on blobs with a constant learning rate, unless a test says otherwise."""
    return make_spec(**{"data": BLOBS, "scheduler": {"name": "none"}, **sections})


def _steps_lrs():
    """Records the learning rate each optimizer step used, for every optimizer in the process."""
    lrs: list[float] = []
    handle = register_optimizer_step_post_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"]))
    return lrs, handle


def test_model_is_moved_before_the_optimizer_is_built():
    job_spec = JobSpec.parse(spec(model={"target": "tests.probes:relocating_linear", "kwargs": {}}))
    parts = build_components(job_spec, torch.device("cpu"), ("tests",))
    optimized = [p for group in parts.optimizer.param_groups for p in group["params"]]
    assert len(optimized) == 2 and all(any(p is q for q in parts.model.parameters()) for p in optimized)


def test_train_mode_for_training_eval_and_no_grad_for_validation_train_restored(run_job):
    run_job(spec(model=RECORDING, loop={"epochs": 2}))
    n_train, n_val = 150 // 32 + 1, math.ceil(50 / 32)
    per_epoch = n_train + n_val
    assert len(probes.FORWARDS) == 2 * per_epoch
    for epoch in range(2):
        forwards = probes.FORWARDS[epoch * per_epoch:(epoch + 1) * per_epoch]
        train, val = forwards[:n_train], forwards[n_train:]
        assert all(f["training"] and f["grad"] for f in train), f"epoch {epoch}: training forward not in train mode"
        assert all(not f["training"] and not f["grad"] for f in val), f"epoch {epoch}: validation in train mode or with autograd"


def test_training_phase_starts_in_train_mode_even_if_user_code_left_eval_on(run_job):
    run_job(spec(model={**RECORDING, "target": "tests.probes:eval_mode_mlp"}, loop={"epochs": 1}))
    assert probes.FORWARDS[0]["training"] and probes.FORWARDS[0]["grad"]


@pytest.mark.parametrize("mode", [True, False])
def test_validation_restores_the_mode_it_found(mode):
    model = probes.RecordingMLP().train(mode)
    loader = torch.utils.data.DataLoader(probes.blobs(n=30), batch_size=8)
    evaluate(model, loader, torch.device("cpu"), Precision("fp32", torch.device("cpu")), build_task(TaskSpec(), ()))
    assert model.training is mode
    assert all(not f["training"] for f in probes.FORWARDS)


def test_gradients_are_cleared_to_none_once_per_optimizer_step(run_job):
    run_job(spec(model=RECORDING, data={**BLOBS, "batch_size": 25}, loop={"epochs": 1, "grad_accum_steps": 2}))
    # 150 training samples / 25 = 6 micro-batches = 3 groups of 2
    assert probes.GRAD_WAS_NONE == [True, False, True, False, True, False]


def test_accumulation_divides_the_loss_and_steps_every_n_micro_batches(run_job):
    common = dict(model={"target": "tests.probes:linear", "kwargs": {}}, optimizer={"name": "sgd", "lr": 0.1},
                  scheduler={"name": "none"}, loop={"epochs": 1, "max_grad_norm": None})
    lrs, handle = _steps_lrs()
    try:
        _, root, whole_id = run_job(make_spec(data={**BLOBS, "kwargs": {"n": 256}, "batch_size": 64}, **common))
        steps_whole = len(lrs)
        _, _, accum_id = run_job(make_spec(data={**BLOBS, "kwargs": {"n": 256}, "batch_size": 32},
                                           **{**common, "loop": {**common["loop"], "grad_accum_steps": 2}}))
        steps_accum = len(lrs) - steps_whole
    finally:
        handle.remove()
    assert steps_whole == steps_accum == 3  # 192 samples: 3 x 64, or 6 x 32 in groups of 2
    a, b = final_state(FileStore(root), whole_id)["model"], final_state(FileStore(root), accum_id)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)


def test_bf16_runs_under_autocast_and_fp32_does_not(run_job):
    run_job(spec(model=RECORDING, loop={"epochs": 1, "precision": "bf16"}))
    assert {f["dtype"] for f in probes.FORWARDS} == {torch.bfloat16}
    probes.FORWARDS.clear()
    run_job(spec(model=RECORDING, loop={"epochs": 1, "precision": "fp32"}))
    assert {f["dtype"] for f in probes.FORWARDS} == {torch.float32}


def test_grad_scaler_only_for_fp16():
    cpu = torch.device("cpu")
    assert not Precision("fp32", cpu).make_scaler().is_enabled()
    assert not Precision("bf16", cpu).make_scaler().is_enabled()
    assert Precision("fp16", cpu).make_scaler().is_enabled()


def test_clipping_sees_unscaled_gradients_and_the_pre_clip_norm_is_returned():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    true_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    before = [p.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    max_norm = true_norm / 10
    reported = optimizer_step(model, optimizer, scaler, max_norm)

    assert reported == pytest.approx(true_norm, rel=1e-5)  # unscaled, and before clipping
    update = torch.linalg.vector_norm(torch.stack([(b - p.detach()).norm() for b, p in zip(before, model.parameters())]))
    assert update.item() == pytest.approx(max_norm, rel=1e-4)  # SGD lr=1 applied the clipped gradient


def test_logged_gradient_norm_is_the_pre_clip_norm(run_job):
    _, root, job = run_job(spec(loop={"epochs": 1, "max_grad_norm": 1e-4}))
    row = read_rows(root, job)[0]
    assert row["grad_norm"] > 1e-3 and row["grad_norm_max"] >= row["grad_norm"]


def test_onecycle_steps_after_every_optimizer_step(run_job):
    lrs, handle = _steps_lrs()
    try:
        run_job(spec(loop={"epochs": 2}, scheduler={"name": "onecycle", "warmup_fraction": 0.3}))
    finally:
        handle.remove()
    steps = 2 * math.ceil(150 / 32)
    reference_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    reference = OneCycleLR(reference_opt, max_lr=0.01, total_steps=steps, pct_start=0.3)
    expected = []
    for _ in range(steps):
        expected.append(reference_opt.param_groups[0]["lr"])
        reference_opt.step()
        reference.step()
    assert lrs == expected


def test_cosine_steps_once_per_epoch_after_the_epoch(run_job):
    lrs, handle = _steps_lrs()
    try:
        run_job(spec(loop={"epochs": 3}, scheduler={"name": "cosine"}))
    finally:
        handle.remove()
    per_epoch = math.ceil(150 / 32)
    reference_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.01)
    reference = CosineAnnealingLR(reference_opt, T_max=3)
    expected = []
    for _ in range(3):
        expected += [reference_opt.param_groups[0]["lr"]] * per_epoch
        reference_opt.step()
        reference.step()
    assert lrs == expected


def test_losses_are_logged_as_python_floats(run_job):
    result, root, job = run_job(spec(loop={"epochs": 1}))
    state = final_state(FileStore(root), job)
    for row in rows_of(state["metrics"]):  # stored as JSON lines: read back as the floats they were
        assert all(type(row[k]) is float for k in ("train_loss", "val_loss", "val_accuracy", "grad_norm"))
    assert type(state["progress"]["epoch_loss_sum"]) is float


def test_validation_loss_is_averaged_per_sample(run_job):
    # 150 held-out samples in batches of 64: 64, 64, 22 -- a per-batch mean would weigh the 22 too much
    job_spec = spec(data={**BLOBS, "kwargs": {"n": 600}, "val_batch_size": 64}, loop={"epochs": 1})
    _, root, job = run_job(job_spec)
    row = read_rows(root, job)[-1]
    state = final_state(FileStore(root), job)
    parts = build_components(JobSpec.parse(job_spec), torch.device("cpu"), ("tests",))
    parts.model.load_state_dict(state["model"])
    parts.model.eval()
    _, val = split_indices(600, 0.25, job_spec["seed"])
    x = torch.stack([parts.data.base[i][0] for i in val])
    y = torch.stack([parts.data.base[i][1] for i in val])
    with torch.no_grad():
        per_sample = torch.nn.functional.cross_entropy(parts.model(x), y, reduction="none").double()
    error = abs(row["val_loss"] - per_sample.mean().item())
    batch_means = [per_sample[i:i + 64].mean().item() for i in range(0, 150, 64)]
    per_batch_error = abs(sum(batch_means) / 3 - row["val_loss"])
    assert error < 1e-6 and per_batch_error > 100 * max(error, 1e-7)  # the test can tell the two apart


def test_nonfinite_loss_fails_the_job_under_fail(run_job):
    with pytest.raises(NonFiniteLossError, match="nan") as failed:
        run_job(spec(data={**BLOBS, "target": "tests.probes:with_nan", "kwargs": {}}, loop={"nonfinite": "fail"}))
    # it says where once: no note naming the next batch beside it ("batch 13 (step 13)", then "its batch 14")
    assert re.search(r"at epoch \d+, batch \d+ \(step \d+\)", str(failed.value)), str(failed.value)
    assert not getattr(failed.value, "__notes__", []), failed.value.__notes__


def test_nonfinite_loss_skips_the_step_under_skip_and_says_where_as_fail_does(run_job, tmp_path):
    nan_data = {**BLOBS, "target": "tests.probes:with_nan", "kwargs": {}}
    with pytest.raises(NonFiniteLossError) as failed:
        run_job(spec(data=nan_data, loop={"epochs": 2, "nonfinite": "fail"}))
    said: list[str] = []

    class Listening(Quiet):
        def log(self, message: str) -> None:
            said.append(message)

    store = FileStore(tmp_path / "skip")
    run_attempt(Attempt(JobSpec.parse(spec(data=nan_data, loop={"epochs": 2, "nonfinite": "skip"})), "skip", 1, store,
                        allowed_prefixes=("tests",)), AttemptOptions(Listening()))
    rows = read_rows(store.root, "skip")
    assert rows[-1]["nonfinite_steps"] > 0
    assert all(torch.isfinite(t).all() for t in final_state(store, "skip")["model"].values())
    where = str(failed.value).split(";")[0]  # "training loss is nan at epoch 1, batch B (step S)"
    assert f"{where}: optimizer step skipped (loop.nonfinite: skip)" in said, (where, said)


@pytest.mark.parametrize("monitor,mode", [("val_loss", "min"), ("val_accuracy", "max")])
def test_best_checkpoint_follows_the_monitored_held_out_metric_not_the_last_epoch(run_job, monitor, mode):
    job_spec = make_spec(model={"target": "tests.probes:linear", "kwargs": {}},
                     data={"target": "tests.probes:diverging", "kwargs": {}, "batch_size": 16, "val_fraction": 0.25},
                     optimizer={"name": "sgd", "lr": 0.5}, scheduler={"name": "none"},
                     loop={"epochs": 4}, checkpoint={"monitor": monitor, "mode": mode})
    result, root, job = run_job(job_spec)
    rows = read_rows(root, job)
    values = [r[monitor] for r in rows]
    best_epoch = values.index(min(values) if mode == "min" else max(values))
    assert best_epoch != len(rows) - 1, "the probe must make the last epoch worse than the best"
    assert result.report["best"]["epoch"] == best_epoch + 1  # epochs count from 1; best_epoch is an index
    best_entry = ManifestStore(FileStore(root), JobPaths(job)).read().best
    best = load_bytes(FileStore(root).get_bytes(best_entry.key), best_entry.sha256)
    assert best["progress"]["epoch"] == best_epoch + 1 and best["progress"]["global_step"] == rows[best_epoch]["step"]
    assert [r["is_best"] for r in rows].index(True) == 0 and rows[best_epoch]["is_best"]
