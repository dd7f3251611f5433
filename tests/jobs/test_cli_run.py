"""`baton run` and `baton validate` as a user runs them: exit codes, messages, resume, learning."""
from __future__ import annotations

import json
import signal
import time

import pytest

from baton.storage.artifacts import final_files, read_verified
from baton.storage.stores.file_store import FileStore
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from tests.helpers import REPO, baton_env, make_spec, read_manifest, run_baton, start_baton, write_spec


@pytest.mark.slow
@pytest.mark.parametrize("example,min_accuracy", [("spiral.yaml", 0.95), ("digits.yaml", 0.95)])
def test_example_jobs_learn(example, min_accuracy, tmp_path):
    done = run_baton("run", str(REPO / "examples" / example), "--id", "ex", "--storage", f"file://{tmp_path}")
    assert done.returncode == 0, done.stdout + done.stderr
    store = FileStore(tmp_path)
    manifest = ManifestStore(store, JobPaths("ex")).read()
    files = final_files(manifest)
    report = json.loads(read_verified(store, files["report.json"]))
    assert report["best"]["val_accuracy"] >= min_accuracy, report["best"]
    assert set(files) == {"model.safetensors", "best.safetensors", "report.json", "curves.png", "metrics.jsonl"}
    for ref in [*files.values(), manifest.best]:
        read_verified(store, ref)
    assert store.exists(JobPaths("ex").spec)


def test_validate_exits_2_naming_the_field(tmp_path):
    bad = write_spec(tmp_path, make_spec(optimizer={"lr": -1}))
    result = run_baton("validate", str(bad))
    assert result.returncode == 2
    assert "optimizer.lr: must be > 0" in result.stderr
    assert run_baton("validate", str(write_spec(tmp_path, make_spec(), "ok.yaml"))).returncode == 0


def test_run_with_a_bad_spec_exits_2_and_writes_nothing(tmp_path):
    bad = write_spec(tmp_path, make_spec(loop={"epochs": 0}))
    result = run_baton("run", str(bad), "--id", "x", "--storage", f"file://{tmp_path / 'store'}")
    assert result.returncode == 2 and "loop.epochs" in result.stderr
    assert not (tmp_path / "store").exists()


@pytest.mark.slow
def test_user_code_exception_exits_1_with_its_traceback(tmp_path):
    spec = write_spec(tmp_path, make_spec(model={"target": "tests.probes:raising", "kwargs": {}}))
    result = run_baton("run", str(spec), "--id", "x", "--storage", f"file://{tmp_path}")
    assert result.returncode == 1
    assert "boom from user model code" in result.stderr and "Traceback" in result.stderr


@pytest.mark.slow
def test_a_base_exception_from_the_jobs_code_is_its_failure_shown_as_any_other(tmp_path):
    spec = write_spec(tmp_path, make_spec(model={"target": "tests.probes:cancelling", "kwargs": {}}))
    result = run_baton("run", str(spec), "--id", "x", "--storage", f"file://{tmp_path}")
    assert result.returncode == 1
    assert "error: CancelledError: cancelled inside the model" in result.stderr, result.stderr
    assert "the whole traceback is in the job's log: baton logs x" in result.stderr, result.stderr


@pytest.mark.slow
def test_finished_job_says_so_and_exits_0(tmp_path):
    spec = write_spec(tmp_path, make_spec(loop={"epochs": 1}, scheduler={"name": "none"}))
    args = ("run", str(spec), "--id", "once", "--storage", f"file://{tmp_path}")
    assert run_baton(*args).returncode == 0
    again = run_baton(*args)
    assert again.returncode == 0 and "already finished" in again.stdout


@pytest.mark.slow
def test_same_id_with_a_different_spec_is_refused(tmp_path):
    first = write_spec(tmp_path, make_spec(loop={"epochs": 1}, scheduler={"name": "none"}), "a.yaml")
    second = write_spec(tmp_path, make_spec(loop={"epochs": 2}, scheduler={"name": "none"}), "b.yaml")
    assert run_baton("run", str(first), "--id", "j", "--storage", f"file://{tmp_path}").returncode == 0
    result = run_baton("run", str(second), "--id", "j", "--storage", f"file://{tmp_path}")
    assert result.returncode == 2 and "different spec" in result.stderr


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_next_step_and_exits_3(tmp_path):
    spec = write_spec(tmp_path, make_spec(checkpoint={"every_steps": 1000}, loop={"epochs": 30}))
    proc = start_baton("run", str(spec), "--id", "t", "--storage", f"file://{tmp_path}", log=tmp_path / "log")
    deadline = time.monotonic() + 60
    store = FileStore(tmp_path)
    while not (read_manifest(store, "t") or {}).get("checkpoints"):  # wait for the first epoch end
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 3, (tmp_path / "log").read_text()
    latest = read_manifest(store, "t")["checkpoints"][-1]
    assert latest["kind"] in ("stop", "epoch") and not read_manifest(store, "t")["completed"]
    assert "run again with --id t to resume" in (tmp_path / "log").read_text()


@pytest.mark.parametrize("command", [["run", "--storage", "file://{store}"], ["submit"], ["sweep", "--grid", "seed=1,2"]])
def test_a_job_id_that_is_not_one_is_refused_in_one_line(tmp_path, command):
    spec = write_spec(tmp_path, make_spec())
    name, *options = [part.format(store=tmp_path / "store") for part in command]
    done = run_baton(name, str(spec), "--id", "team/x", *options)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "--id: job id must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$ (got 'team/x')"], done.stderr
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("index,where", [
    (0, r"while loading sample 0 of the training set .*\n  while training step \d+ \(epoch 1, its batch \d+\)"),
    (7, r"while loading sample 7 of the validation set .*\n  while validating after step \d+ \(epoch 1\)"),
])
@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_data_set_shows_the_cause_where_and_the_users_frames_first(tmp_path, index, where, num_workers):
    """With loader workers, torch re-raises the worker's exception with its traceback as text: shown the same."""
    import re

    spec = write_spec(tmp_path, make_spec(data={"target": "tests.probes:failing_at", "kwargs": {"index": index},
                                                "num_workers": num_workers}))
    url = f"file://{tmp_path / 'store'}"
    done = run_baton("run", str(spec), "--id", "bad", "--storage", url)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    headline = f"error: ValueError: record {index} is corrupt"
    expected = headline if num_workers == 0 else f"{headline} (in DataLoader worker process "
    assert lines[0].startswith(expected) and (num_workers or lines[0] == headline), done.stderr
    assert re.search(where, done.stderr), done.stderr
    assert "Traceback (your code's frames, most recent call last):" in done.stderr
    frames = re.findall(r'File "([^"]+)"', done.stderr)
    assert frames and all(path.endswith("tests/probes.py") for path in frames), done.stderr
    assert lines[-1] == f"the whole traceback is in the job's log: baton logs bad --storage {url}"
    log = run_baton("logs", "bad", "--storage", url).stdout
    assert "workers/training/data.py" in log and "tests/probes.py" in log and f"record {index} is corrupt" in log


@pytest.mark.slow
def test_fetch_finds_a_baton_run_job_in_its_store(tmp_path, redis_server):
    """A `baton run` job has no record in Redis: `baton fetch` reads its store, the configured one
    (BATON_STORAGE_URL) or the one named with --storage; a job the store does not hold is one line."""
    spec = write_spec(tmp_path, make_spec(loop={"epochs": 1}, scheduler={"name": "none"}))
    store = f"file://{tmp_path / 'store'}"
    assert run_baton("run", str(spec), "--id", "local", "--storage", store).returncode == 0
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=store)
    fetched = run_baton("fetch", "local", "--which", "final", "-o", str(tmp_path / "a"), env=env)
    assert fetched.returncode == 0 and (tmp_path / "a/local/model.safetensors").is_file(), fetched.stderr
    fetched = run_baton("fetch", "local", "-o", str(tmp_path / "b"), "--storage", store)
    assert fetched.returncode == 0 and (tmp_path / "b/local/best.pt").is_file(), fetched.stderr
    missing = run_baton("fetch", "nope", "--storage", store)
    assert missing.returncode == 1 and missing.stderr.strip() == f"no job 'nope' under {store}/jobs/nope", missing.stderr


def test_a_client_command_says_which_redis_it_uses_when_none_is_set(redis_server):
    """On a shared machine the default (127.0.0.1:6379) may be somebody else's Redis: said first."""
    unset = {k: v for k, v in baton_env().items() if k != "BATON_REDIS_URL"}
    done = run_baton("status", "nope", env=unset)
    assert done.stderr.splitlines()[0] == ("baton: BATON_REDIS_URL is not set; using the default Redis at "
                                           "redis://127.0.0.1:6379/0"), done.stderr
    told = run_baton("status", "nope", env=baton_env(BATON_REDIS_URL=redis_server.url))
    assert told.returncode == 1 and "BATON_REDIS_URL is not set" not in told.stderr, told.stderr
