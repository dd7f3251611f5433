"""The shipped examples' shapes through `baton submit` to real workers: a step-based language model on
a stream with a separate validation set, and regression with a fixed validation set. Each ends
succeeded, bit-identical to `baton run`, and its fetched best checkpoint loads into the model class
in a fresh process. (CI-sized: the examples' own lengths are for people, see the README.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO, assert_same_training, baton_env, final_state, make_spec, run_baton, write_spec
from baton.storage.stores.file_store import FileStore


def _shortened(example: str, **loop) -> dict:
    spec = yaml.safe_load((REPO / "examples" / example).read_text())
    spec["loop"].update(loop)
    spec["resources"] = {"device": "cpu", "cpu_threads": 1}
    return spec


def _charlm() -> dict:
    spec = _shortened("charlm.yaml", max_steps=24, eval_every_steps=8)
    spec["model"]["kwargs"].update(width=32, layers=1, heads=2)
    for part in (spec["data"], spec["data"]["val"]):
        part["kwargs"]["max_bytes"] = 30_000
    spec["scheduler"]["warmup_steps"] = 4
    spec["checkpoint"]["every_steps"] = 4
    return spec


EXAMPLES = {
    "charlm": (_charlm(), "val_perplexity",
               "from baton.workers.training.builtins.gpt import char_transformer as build; "
               "kwargs = dict(block=64, width=32, layers=1, heads=2)"),
    "diabetes": (_shortened("diabetes.yaml", epochs=4), "val_mae",
                 "from baton.workers.training.builtins.models import mlp as build; "
                 "kwargs = dict(in_features=10, hidden=64, out_features=1, layers=2, dropout=0.1)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_through_workers_matches_baton_run_and_its_best_loads(name, cluster, tmp_path):
    spec, monitor, build = EXAMPLES[name]
    reference_root = tmp_path / "reference"
    done = run_baton("run", str(write_spec(tmp_path, spec)), "--id", name, "--storage", f"file://{reference_root}")
    assert done.returncode == 0, done.stdout + done.stderr

    cluster.start_workers(1)
    job = cluster.client.submit(spec, name)
    final = job.wait(timeout=240, progress=False)
    assert final.state.value == "succeeded", final.error
    assert_same_training(FileStore(reference_root), name, cluster.store(), name)

    fetched = run_baton("fetch", name, "--which", "best", "-o", str(tmp_path / "out"),
                        env=baton_env(BATON_REDIS_URL=cluster.redis_url, BATON_STORAGE_URL=cluster.storage_url))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    [checkpoint] = [p for p in (tmp_path / "out").rglob("*.pt")]
    load = subprocess.run(
        [sys.executable, "-c",
         f"import sys, torch; {build}; model = build(**kwargs); "
         f"state = torch.load(sys.argv[1], weights_only=True); model.load_state_dict(state['model']); "
         f"print(state['best']['metric'], state['best']['value'])", str(checkpoint)],
        capture_output=True, text=True, cwd=REPO, env=baton_env())
    assert load.returncode == 0, load.stderr
    assert load.stdout.split()[0] == monitor


@pytest.mark.slow
def test_a_job_that_sets_no_thread_count_trains_the_same_bits_on_a_worker_as_in_baton_run(cluster, tmp_path):
    """G1 with the spec's defaults: the worker's training process takes the thread count `baton run`
    takes (torch's own default here, not the count the worker pinned for itself), and records it."""
    machine = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                             capture_output=True, text=True, check=True)
    if int(machine.stdout) < 2:
        pytest.skip("one core: every thread count is the same")
    spec = make_spec(model={"target": "tests.probes:thread_sensitive", "kwargs": {}}, loop={"epochs": 1})
    spec["resources"] = {"device": "cpu"}
    reference_root = tmp_path / "reference"
    done = run_baton("run", str(write_spec(tmp_path, spec)), "--id", "threads", "--storage", f"file://{reference_root}")
    assert done.returncode == 0, done.stdout + done.stderr

    cluster.start_workers(1)
    final = cluster.client.submit(spec, "threads").wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    recorded = [final_state(store, "threads")["config"]["cpu_threads"] for store in (FileStore(reference_root),
                                                                                      cluster.store())]
    assert recorded == [int(machine.stdout)] * 2
    assert_same_training(FileStore(reference_root), "threads", cluster.store(), "threads")
