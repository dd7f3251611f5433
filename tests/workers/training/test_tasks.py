"""Tasks: built-in and user tasks keep the loop's rules and bit-exact resume; bad tasks fail clearly."""
from __future__ import annotations

import re

import pytest
import torch

from baton.schemas.errors import NonFiniteLossError, PermanentError
from baton.storage.stores.file_store import FileStore
from baton.workers.training.task_api import TaskError

from tests import tasks
from tests.helpers import (
    assert_same_training,
    kill_when,
    make_spec,
    metrics_rows,
    read_manifest,
    run_baton,
    run_reference,
    start_baton,
    write_spec,
)
from tests.workers.conftest import read_rows

DICT_TASK = {"target": "tests.tasks:dict_task", "kwargs": {}}
DICT_MODEL = {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.2}}
DICT_DATA = {"target": "tests.tasks:dict_blobs", "kwargs": {"n": 480},
             "val": {"target": "tests.tasks:dict_blobs", "kwargs": {"n": 120, "offset": 10_000}}, "batch_size": 16}
STREAM_DATA = {"target": "tests.tasks:blob_stream", "kwargs": {"n": 320},
               "val": {"target": "tests.tasks:dict_blobs", "kwargs": {"n": 120, "offset": 10_000}}, "batch_size": 16}
TINY_GPT = {"target": "builtin:char_transformer",
            "kwargs": {"block": 16, "width": 32, "layers": 1, "heads": 2, "dropout": 0.1}}
TEXT = {"part": "train", "block": 16, "max_bytes": 40_000}


def lm_spec(num_workers: int) -> dict:
    return make_spec(
        model=TINY_GPT, task={"target": "builtin:language_model"},
        data={"target": "builtin:stdlib_text", "kwargs": TEXT, "val_fraction": None, "batch_size": 8,
              "num_workers": num_workers, "val": {"target": "builtin:stdlib_text", "kwargs": {**TEXT, "part": "val"}}},
        optimizer={"name": "adamw", "lr": 0.003, "weight_decay": 0.1, "no_decay_bias_and_norm": True},
        scheduler={"name": "warmup_cosine", "warmup_steps": 5, "min_lr_ratio": 0.1},
        loop={"epochs": None, "max_steps": 70, "eval_every_steps": 20, "grad_accum_steps": 2},
        checkpoint={"every_steps": 4, "monitor": "val_perplexity"},
    )


def _no_split(data: dict) -> dict:
    return {**data, "val_fraction": None}


def _paced(data: dict) -> dict:
    """``data`` loading each training sample in 1 ms: a killed run's data, so that a loaded machine's run
    cannot pass the kill condition between two polls."""
    return {**data, "kwargs": {**data["kwargs"], "delay_s": 0.001}}


CASES = {
    # the default task, on the classic spec (tests/workers/attempt/test_exact_resume.py kills it once); data
    # paced (1 ms a sample): unpaced, a loaded machine's run could pass the kill condition between two polls
    "classification-spiral": make_spec(checkpoint={"every_steps": 4},
                                       data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300}}),
    "regression-diabetes": make_spec(
        model={"target": "builtin:mlp", "kwargs": {"in_features": 10, "hidden": 32, "out_features": 1, "dropout": 0.1}},
        data={"target": "tests.probes:slow_diabetes", "kwargs": {"part": "train"}, "val_fraction": None,
              "batch_size": 16, "val": {"target": "builtin:diabetes", "kwargs": {"part": "val"}}},
        task={"target": "builtin:regression"}, loop={"epochs": 4}, checkpoint={"every_steps": 4, "monitor": "val_mae"},
    ),
    "language-model-stream-workers0": lm_spec(0),
    "language-model-stream-workers2": lm_spec(2),
    "user-dict-task-map": make_spec(model=DICT_MODEL, data=_paced(_no_split(DICT_DATA)), task=DICT_TASK,
                                    loop={"epochs": 3, "grad_accum_steps": 3},
                                    checkpoint={"every_steps": 4, "monitor": "val_f1", "mode": "max"}),
    "user-dict-task-stream-workers2": make_spec(
        model=DICT_MODEL, data={**_paced(_no_split(STREAM_DATA)), "num_workers": 2}, task=DICT_TASK,
        scheduler={"name": "constant_warmup", "warmup_steps": 10},
        loop={"epochs": None, "max_steps": 60, "eval_every_steps": 15},
        checkpoint={"every_steps": 4, "monitor": "val_f1", "mode": "max"}),
}


def _newer_mid_run_checkpoint(after: int):
    """True once a periodic checkpoint past step ``after`` is the latest committed one."""
    def ready(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return latest is not None and latest["kind"] == "step" and latest["step"] > after + 4
    return ready


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_killed_twice_mid_run_then_resumed_is_bit_exact(case, tmp_path):
    spec_path = write_spec(tmp_path, CASES[case])
    store = run_reference(tmp_path, CASES[case])  # in this process; the cut runs are `baton run` processes

    killed_at = 0
    for attempt in (1, 2):
        proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, log=tmp_path / f"cut-{attempt}.log")
        at_kill = kill_when(proc, store, "cut", _newer_mid_run_checkpoint(killed_at))
        killed_at = at_kill["checkpoints"][-1]["step"]
    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert re.search(rf"resuming cut from step {killed_at} ", resumed.stdout), resumed.stdout
    assert killed_at < (CASES[case]["loop"].get("max_steps") or 10**9)

    assert_same_training(store, "reference", store, "cut")
    rows = metrics_rows(store, "cut")
    monitor = CASES[case]["checkpoint"]["monitor"]
    assert all(monitor in row for row in rows)


def test_a_user_task_is_called_under_the_loop_rules(run_job):
    tasks.CALLS.clear()
    run_job(make_spec(model=DICT_MODEL, data=_no_split(DICT_DATA), task=DICT_TASK, loop={"epochs": 2},
                      checkpoint={"monitor": "val_f1", "mode": "max"}))
    losses = [c for c in tasks.CALLS if c[0] == "loss"]
    scores = [c for c in tasks.CALLS if c[0] == "score"]
    assert len(losses) == 2 * 30 and len(scores) == 2 * 8
    assert all(training and grad for _, training, grad in losses), "loss() must run in train mode with autograd"
    assert all(not training and not grad for _, training, grad in scores), "score() must run in eval mode, no autograd"
    # validation sits between the epochs' training calls: train() was restored after it
    assert [c[0] for c in tasks.CALLS[30:30 + 8 + 1]] == ["score"] * 8 + ["loss"]


def test_a_user_metric_is_reported_and_picks_the_best(run_job):
    result, root, job = run_job(make_spec(model=DICT_MODEL, data=_no_split(DICT_DATA), task=DICT_TASK,
                                          loop={"epochs": 3}, checkpoint={"monitor": "val_f1", "mode": "max"}))
    rows = read_rows(root, job)
    f1 = [r["val_f1"] for r in rows]
    assert all(0.0 <= v <= 1.0 for v in f1) and set(rows[0]) >= {"val_f1", "val_loss", "train_loss"}
    assert result.report["best"]["value"] == max(f1) and result.report["monitor"] == "val_f1"
    assert rows[f1.index(max(f1))]["is_best"]


def _nothing_committed(root, job: str) -> bool:
    manifest = read_manifest(FileStore(root), job)
    return manifest is None or not manifest["checkpoints"]


BAD = {
    # (spec changes, the error type, what its message must say)
    "monitor the task does not report": (
        dict(task=DICT_TASK, checkpoint={"monitor": "val_f2", "mode": "max"}), PermanentError,
        "checkpoint.monitor: 'val_f2' is not reported by task tests.tasks:dict_task; "
        "it reports ['train_loss', 'val_f1', 'val_loss']"),
    "non-scalar loss": (dict(task={"target": "tests.tasks:non_scalar_loss"}), TaskError,
                        "task tests.tasks:non_scalar_loss: loss() returned a tensor of shape [16]; it must be a scalar"),
    "metric that is not a torchmetrics Metric": (
        dict(task={"target": "tests.tasks:not_a_metric"}), TaskError,
        "task tests.tasks:not_a_metric: metric 'f1' is a function, not a torchmetrics.Metric"),
    "non-finite loss": (dict(task={"target": "tests.tasks:nan_loss"}), NonFiniteLossError, "training loss is nan"),
    "a batch the task cannot read": (
        dict(task={"target": "builtin:classification"}), TaskError,
        "task builtin:classification: loss() raised ValueError: expected a batch of (inputs, targets) or "
        "{'input': ..., 'target': ...}; got {features: Tensor[16, 2] float32, label: Tensor[16] int64}"),
    "regression targets under classification (a loss of zero by construction)": (
        dict(task={"target": "builtin:classification"},
             model={"target": "builtin:mlp", "kwargs": {"in_features": 10, "out_features": 1}},
             data={"target": "builtin:diabetes", "kwargs": {}, "batch_size": 16, "val_fraction": 0.2}), TaskError,
        "model output [16, 1] float32 is not class logits (B, C>=2, ...): cross-entropy over one class is identically 0"),
    "float targets for classification": (
        dict(task={"target": "builtin:classification"},
             data={"target": "builtin:diabetes", "kwargs": {}, "batch_size": 16, "val_fraction": 0.2},
             model={"target": "builtin:mlp", "kwargs": {"in_features": 10, "out_features": 2}}), TaskError,
        "targets [16, 1] float32 are not integer class labels"),
    "regression output and target shapes differ": (
        dict(task={"target": "builtin:regression"},
             data={"target": "builtin:diabetes", "kwargs": {}, "batch_size": 16, "val_fraction": 0.2},
             model={"target": "builtin:mlp", "kwargs": {"in_features": 10, "out_features": 2}},
             checkpoint={"monitor": "val_mae"}), TaskError,
        "model output [16, 2] float32 and targets [16, 1] float32 differ in shape"),
    "stream without state_dict": (
        dict(task=DICT_TASK, data={"target": "tests.tasks:stream_without_state", "kwargs": {}, "val_fraction": None,
                                   "val": DICT_DATA["val"], "batch_size": 16},
             loop={"epochs": None, "max_steps": 10}, scheduler={"name": "none"}), PermanentError,
        "is an IterableDataset without state_dict()"),
    "stream counted in epochs": (
        dict(task=DICT_TASK, data=_no_split(STREAM_DATA)), PermanentError,
        "it needs loop.max_steps (a stream's length is unknown"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_task_input_fails_naming_the_task_and_writes_no_checkpoint(case, run_job, tmp_path):
    changes, error, message = BAD[case]
    base = dict(model=DICT_MODEL, data=_no_split(DICT_DATA), scheduler={"name": "none"})
    spec = make_spec(**{**base, **changes})
    with pytest.raises(error) as caught:
        run_job(spec, job_id="bad")
    assert message in str(caught.value), str(caught.value)
    assert _nothing_committed(tmp_path / "store", "bad")


@pytest.mark.slow
def test_baton_run_of_a_bad_task_exits_1_naming_it(tmp_path):
    spec_path = write_spec(tmp_path, make_spec(model=DICT_MODEL, data=_no_split(DICT_DATA),
                                               task={"target": "tests.tasks:non_scalar_loss"}))
    store = FileStore(tmp_path / "store")
    result = run_baton("run", str(spec_path), "--id", "bad", "--storage", store.url)
    assert result.returncode == 1
    assert "task tests.tasks:non_scalar_loss: loss() returned a tensor of shape [16]" in result.stdout + result.stderr
    assert _nothing_committed(store.root, "bad")


def test_language_model_validation_averages_per_token_like_training(run_job):
    spec = lm_spec(0)
    spec["loop"] = {**spec["loop"], "max_steps": 1, "eval_every_steps": None, "grad_accum_steps": 1}
    spec["scheduler"] = {"name": "none"}
    spec["data"]["val"] = {"target": "builtin:stdlib_text", "kwargs": {**TEXT, "part": "train"}}  # score what trains
    result, root, job = run_job(spec)
    row = read_rows(root, job)[-1]
    # one step in, the same text scores as it trained: per token, near log(256) = 5.55 for an untrained byte model;
    # a per-sequence average of summed token losses would be 16x (block) that
    assert 4.5 < row["train_loss"] < 6.5 and abs(row["val_loss"] / row["train_loss"] - 1) < 0.1
    assert row["val_perplexity"] == pytest.approx(torch.tensor(row["val_loss"]).exp().item(), rel=1e-4)


@pytest.mark.parametrize("task_class, kwargs, make_batch", [
    ("Classification", {"num_classes": 3},
     lambda g: (torch.randn(16, 3, generator=g), torch.randint(0, 3, (16,), generator=g))),
    ("Regression", {}, lambda g: (torch.randn(16, 3, generator=g), torch.randn(16, 3, generator=g))),
])
def test_reused_builtin_metrics_score_exactly_as_fresh_ones(task_class, kwargs, make_batch):
    """A built-in task's metrics are reset and reused between validations (reusable_metrics): each
    validation's values equal, bit for bit, those of metrics made new for it."""
    from baton.workers.training.amp import Precision
    from baton.workers.training.builtins import tasks as builtin
    from baton.workers.training.evaluate import evaluate

    cpu = torch.device("cpu")
    model = torch.nn.Identity()
    reused = bound_task(getattr(builtin, task_class)(**kwargs))
    first = None
    for validation in range(3):
        g = torch.Generator().manual_seed(validation)
        batches = [make_batch(g) for _ in range(3)]
        fresh = bound_task(getattr(builtin, task_class)(**kwargs))
        got = evaluate(model, batches, cpu, Precision("fp32", cpu), reused)
        want = evaluate(model, batches, cpu, Precision("fp32", cpu), fresh)
        assert got == want
        kept = reused.new_metrics(cpu)
        first = first or kept
        assert kept is first  # the same objects each time: reused, not remade


def bound_task(task):
    from baton.workers.training.task_api import BoundTask

    return BoundTask(task, "builtin:test")
