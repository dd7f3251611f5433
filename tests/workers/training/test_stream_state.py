"""A stream's state_dict() in a checkpoint: numpy scalars resume exactly (as the very numpy values the
stream gave); a value torch.load(weights_only=True) would refuse fails the job at its first
checkpoint, naming where it is, with nothing committed."""
from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch

from baton.schemas.errors import UserCodeError
from baton.storage.stores.file_store import FileStore

from tests.helpers import (
    assert_bit_equal,
    assert_same_training,
    final_state,
    kill_when,
    make_spec,
    read_manifest,
    run_baton,
    run_reference,
    start_baton,
    write_spec,
)

from tests.workers.training.test_tasks import DICT_MODEL, DICT_TASK

VAL = {"target": "tests.tasks:dict_blobs", "kwargs": {"n": 120, "offset": 10_000}}


def stream_spec(target: str, num_workers: int = 0) -> dict:
    return make_spec(
        model=DICT_MODEL, task=DICT_TASK,
        data={"target": target, "kwargs": {"n": 320}, "val": VAL, "batch_size": 16, "val_fraction": None,
              "num_workers": num_workers},
        scheduler={"name": "constant_warmup", "warmup_steps": 10},
        loop={"epochs": None, "max_steps": 48, "eval_every_steps": 16},
        checkpoint={"every_steps": 4, "monitor": "val_f1", "mode": "max"},
    )


def _mid_run_checkpoint(manifest: dict) -> bool:
    latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
    return latest is not None and latest["kind"] == "step" and 8 <= latest["step"] < 40


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_counting_in_numpy_scalars_resumes_bit_exact(num_workers, tmp_path):
    spec = stream_spec("tests.tasks:numpy_state_stream", num_workers)
    spec_path = write_spec(tmp_path, spec)
    store = run_reference(tmp_path, spec)

    proc = start_baton("run", str(spec_path), "--id", "cut", "--storage", store.url, log=tmp_path / "cut.log")
    killed_at = kill_when(proc, store, "cut", _mid_run_checkpoint)["checkpoints"][-1]["step"]
    resumed = run_baton("run", str(spec_path), "--id", "cut", "--storage", store.url)

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert re.search(rf"resuming cut from step {killed_at} ", resumed.stdout), resumed.stdout
    assert_same_training(store, "reference", store, "cut")  # torch.equal on every tensor, equal metrics rows
    assert_bit_equal(final_state(store, "reference")["data"], final_state(store, "cut")["data"], "data")


def test_a_stream_state_weights_only_refuses_fails_at_the_first_checkpoint_naming_it(run_job, tmp_path):
    spec = stream_spec("tests.tasks:numpy_generator_stream")
    with pytest.raises(UserCodeError) as caught:
        run_job(spec, job_id="bad")
    message = str(caught.value)
    assert message.startswith("data target tests.tasks:numpy_generator_stream: state_dict()['rng'] is a "
                              "numpy.random._generator.Generator, which torch.load(weights_only=True) refuses"), message
    manifest = read_manifest(FileStore(tmp_path / "store"), "bad")
    assert manifest is None or not manifest["checkpoints"]


def _weights_only_round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_numpy_values_come_back_as_the_same_type_and_bits():
    from baton.workers.training.stream_state import from_checkpoint, to_checkpoint

    values = {
        "i64": np.int64(-2**63), "u64": np.uint64(2**64 - 1), "i8": np.int8(-7), "flag": np.bool_(True),
        "f64": np.float64(0.1), "f32": np.float32(1 / 3), "f16": np.float16(65504), "nan": np.float32("nan"),
        "neg0": np.float64(-0.0), "array": np.arange(6, dtype=np.int32).reshape(2, 3),
        "floats": np.array([0.5, np.inf], dtype=np.float32), "plain": [1, 2.5, "x", None],
    }
    back = from_checkpoint(_weights_only_round_trip(to_checkpoint(values, "data target t")))
    for name, value in values.items():
        assert type(back[name]) is type(value), name
        if isinstance(value, (np.generic, np.ndarray)):
            assert back[name].dtype == value.dtype and back[name].tobytes() == value.tobytes(), name
        else:
            assert back[name] == value
