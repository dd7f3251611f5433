"""The loop reads the device at most once per optimizer step (issue 12), and what it reads is
exactly what per-micro-batch ``.item()`` calls gave."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from baton.schemas.errors import NonFiniteLossError
from baton.workers.training import readings
from baton.workers.training.readings import PendingReadings

from tests.helpers import make_spec
from tests.workers.conftest import read_rows

BLOBS = {"target": "tests.probes:blobs", "kwargs": {"n": 200}, "batch_size": 16, "val_fraction": 0.25}
LOOP_FILES = ("workers/training/loop.py", "workers/training/amp.py")


def test_pending_readings_are_the_values_item_gives_in_order():
    pending = PendingReadings()
    losses = [torch.tensor(0.1), torch.tensor(1 / 3), torch.tensor(math.nan), torch.tensor(2.5e-8)]
    for i, loss in enumerate(losses):
        pending.add_loss(loss, samples=i + 1, epoch=0, batch_in_epoch=i, step=i // 2)
    pending.add_norm(torch.tensor(7.25))
    read, norms = pending.read()
    assert [r.samples for r in read] == [1, 2, 3, 4] and [r.batch_in_epoch for r in read] == [0, 1, 2, 3]
    for r, loss in zip(read, losses):
        assert r.value == loss.item() or (math.isnan(r.value) and math.isnan(loss.item()))
    assert norms == [7.25]
    assert pending.read() == ([], [])  # emptied


def test_mixed_dtypes_are_read_one_by_one_with_item():
    pending = PendingReadings()
    pending.add_loss(torch.tensor(1 / 3, dtype=torch.bfloat16), 1, 0, 0, 0)
    pending.add_norm(torch.tensor(1 / 3, dtype=torch.float64))
    (loss,), norms = pending.read()
    assert loss.value == torch.tensor(1 / 3, dtype=torch.bfloat16).item() and norms == [1 / 3]


def test_no_device_read_per_micro_batch_only_one_per_optimizer_step(run_job, monkeypatch):
    """With 4 micro-batches per step, the loop never calls .item()/float() itself, and reads the
    pending values at most once per step (plus once per validation and per checkpoint)."""
    from_loop = []
    for name in ("item", "__float__", "tolist"):
        original = getattr(torch.Tensor, name)

        def wrapped(self, *args, _original=original, _name=name, **kwargs):
            caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
            if caller.endswith(LOOP_FILES):
                from_loop.append((_name, caller))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, wrapped)
    transfers = []
    original_to_floats = readings._to_floats
    monkeypatch.setattr(readings, "_to_floats", lambda ts: transfers.append(len(ts)) or original_to_floats(ts))

    _, root, job = run_job(make_spec(data=BLOBS, scheduler={"name": "none"},
                                     loop={"epochs": 2, "grad_accum_steps": 4}, checkpoint={"every_steps": 2}))
    rows = read_rows(root, job)
    steps, micro_batches = rows[-1]["step"], 2 * math.ceil(150 / 16)
    assert from_loop == []
    assert len(transfers) <= steps + len(rows) + steps // 2  # every_steps: 2
    assert len(transfers) < micro_batches
    assert all(math.isfinite(r["train_loss"]) and r["grad_norm"] > 0 for r in rows)


def test_a_nonfinite_loss_in_the_middle_of_a_group_fails_naming_its_micro_batch(run_job):
    """Under ``fail``, the error names the micro-batch whose loss was not finite, as it did when
    each loss was read at once, although the check now happens at the group's step."""
    with pytest.raises(NonFiniteLossError, match=r"training loss is nan at epoch 1, batch (\d+) \(step (\d+)\)") as info:
        run_job(make_spec(data={**BLOBS, "target": "tests.probes:with_nan", "kwargs": {"bad_every": 1000}},
                          scheduler={"name": "none"}, loop={"epochs": 1, "grad_accum_steps": 4, "nonfinite": "fail"}))
    import re

    batch, step = map(int, re.search(r"batch (\d+) \(step (\d+)\)", str(info.value)).groups())
    assert step - 1 == (batch - 1) // 4  # the step the micro-batch belonged to, not the one after (both from 1)


def test_the_one_transfer_path_reads_the_values_item_gives():
    """On an accelerator the pending values are stacked and read in one transfer; the CPU reads
    each with .item(). Both give the same floats (checked here on the CPU's tensors)."""
    values = [torch.tensor(0.1), torch.tensor(1 / 3), torch.tensor(math.nan), torch.tensor(-2.5e-8)]
    stacked = readings._stacked_floats(values)
    direct = readings._to_floats(values)
    for got, one, tensor in zip(stacked, direct, values):
        expected = tensor.item()
        assert (got == expected and one == expected) or (math.isnan(got) and math.isnan(one) and math.isnan(expected))
