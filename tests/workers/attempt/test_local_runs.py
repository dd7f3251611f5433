"""`baton run` of one job id in two processes at once: one trains, the other refuses in one line (exit
4) while the first is alive; the one that trains ends bit-exact and loses no committed checkpoint. A
run whose process is gone (SIGKILL) is taken over at once on the same machine, and the scratch
directories it left (its checkpoint spool, TensorBoard's local files) are removed."""
from __future__ import annotations

import pytest

import os
import signal
import subprocess
import time

from baton.storage.stores.file_store import FileStore
from tests.helpers import (
    BATON,
    REPO,
    assert_same_training,
    baton_env,
    kill_when,
    make_spec,
    read_manifest,
    run_baton,
    start_baton,
    write_spec,
)
from tests.workers.conftest import SPEC

RUNNING_ELSEWHERE = 4


def _start(spec_path, url: str, job_id: str, **env: str):
    return start_baton("run", str(spec_path), "--id", job_id, "--storage", url, "--no-progress", env=baton_env(**env),
                       capture=True)


def _every_referenced_checkpoint_exists(store: FileStore, job_id: str) -> None:
    manifest = read_manifest(store, job_id)
    keys = [e["key"] for e in manifest["checkpoints"]] + ([manifest["best"]["key"]] if manifest["best"] else [])
    missing = [key for key in keys if not store.exists(key)]
    assert not missing, f"committed checkpoints deleted: {missing}"


@pytest.mark.slow
def test_two_runs_started_together_one_trains_the_other_refuses_and_a_third_mid_run_refuses(tmp_path, reference):
    hold = tmp_path / "hold"  # the one that trains waits here, past its first checkpoints, until the third came
    hold.touch()
    held = make_spec(data={**SPEC["data"], "kwargs": {**SPEC["data"]["kwargs"], "hold": str(hold), "hold_after": 200}},
                     loop=SPEC["loop"], checkpoint=SPEC["checkpoint"])  # (SPEC's samples: the reference's bits)
    spec_path = write_spec(tmp_path, held)
    url = f"file://{tmp_path / 'store'}"
    store = FileStore(tmp_path / "store")
    a, b = _start(spec_path, url, "twice"), _start(spec_path, url, "twice")
    loser = None
    while loser is None:
        time.sleep(0.05)
        loser = next((p for p in (a, b) if p.poll() is not None), None)
    winner = b if loser is a else a
    out, err = loser.communicate()
    assert loser.returncode == RUNNING_ELSEWHERE, out + err
    assert len(err.strip().splitlines()) == 1 and err.startswith("job twice is running elsewhere: "), err

    while not (read_manifest(store, "twice") or {}).get("checkpoints"):  # a third, once checkpoints exist
        assert winner.poll() is None, winner.communicate()
        time.sleep(0.05)
    third = run_baton("run", str(spec_path), "--id", "twice", "--storage", url)
    assert third.returncode == RUNNING_ELSEWHERE and third.stderr.startswith("job twice is running elsewhere: ")
    hold.unlink()

    out, err = winner.communicate(timeout=240)
    assert winner.returncode == 0, out + err
    _every_referenced_checkpoint_exists(store, "twice")
    assert_same_training(reference, "reference", store, "twice")


@pytest.mark.slow
def test_a_run_killed_outright_is_taken_over_at_once_and_ends_bit_exact(tmp_path, reference):
    spec_path = write_spec(tmp_path, SPEC)
    url = f"file://{tmp_path / 'store'}"
    store = FileStore(tmp_path / "store")
    first = _start(spec_path, url, "taken")
    kill_when(first, store, "taken", lambda m: bool(m["checkpoints"]))
    assert first.returncode == -signal.SIGKILL
    again = run_baton("run", str(spec_path), "--id", "taken", "--storage", url)
    assert again.returncode == 0, again.stdout + again.stderr
    _every_referenced_checkpoint_exists(store, "taken")
    assert_same_training(reference, "reference", store, "taken")


@pytest.mark.slow
def test_following_the_log_of_a_run_killed_outright_stops_and_says_so(tmp_path):
    from baton.storage.job_log import log_chunks

    slower = make_spec(data={**SPEC["data"], "kwargs": {"n_per_class": 300, "delay_s": 0.01}}, loop={"epochs": 2})
    spec_path = write_spec(tmp_path, slower)
    url = f"file://{tmp_path / 'store'}"
    store = FileStore(tmp_path / "store")
    run = _start(spec_path, url, "followed")
    while not log_chunks(store, "followed"):
        assert run.poll() is None, run.communicate()
        time.sleep(0.1)
    follower = subprocess.Popen([*BATON, "logs", "followed", "-f", "--storage", url], env=baton_env(), cwd=REPO,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(3)
    assert follower.poll() is None, "it follows while the run lives"
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    out, err = follower.communicate(timeout=30)  # before: it polled for ever
    assert follower.returncode == 0, err
    assert "job followed: no run holds it now (its process is gone, or it is not running): stopped following" in err
    assert "attempt 1 of job followed started" in out


@pytest.mark.slow
def test_baton_run_refuses_a_job_submitted_to_a_queue(cluster, tmp_path):
    """A queue's job is its workers': a `baton run` of it would claim the next attempt, fencing out the
    worker that holds it (and be fenced out by the next claim), running the job twice over."""
    from tests.helpers import make_spec, run_baton, write_spec

    spec = make_spec(loop={"epochs": 1}, scheduler={"name": "none"})
    cluster.client.submit(spec, "queued-one")
    done = run_baton("run", str(write_spec(tmp_path, spec)), "--id", "queued-one", "--storage", cluster.storage_url,
                     "--no-progress", env=cluster.env)
    assert done.returncode == 4, done.stdout + done.stderr
    assert done.stderr.strip() == ("job queued-one was submitted to a queue, whose workers run it (baton status "
                                   "queued-one); baton run runs only the jobs it started: use a new --id to train it here")
    assert not cluster.store().exists("jobs/queued-one/manifest.json")  # nothing trained, nothing claimed


@pytest.mark.slow
def test_the_scratch_of_a_run_killed_outright_is_removed_by_the_next_run(tmp_path):
    spec_path = write_spec(tmp_path, SPEC)
    url = f"file://{tmp_path / 'store'}"
    store = FileStore(tmp_path / "store")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    spools, event_dirs = store.scratch_dir(), tmp  # a file store spools beside its objects (a rename, not a copy)

    def scratch() -> set:
        return {*spools.glob("baton-spool-*"), *event_dirs.glob("baton-tensorboard-*")}

    first = _start(spec_path, url, "swept", TMPDIR=str(tmp))
    kill_when(first, store, "swept", lambda m: m["metrics"] is not None and len(scratch()) == 2)
    left = scratch()
    assert {path.name.split("-")[1] for path in left} == {"spool", "tensorboard"}

    again = run_baton("run", str(spec_path), "--id", "swept", "--storage", url, env=baton_env(TMPDIR=str(tmp)))
    assert again.returncode == 0, again.stdout + again.stderr
    assert not scratch(), f"scratch left behind: {sorted(scratch())}"


@pytest.mark.slow
def test_baton_recover_leaves_a_baton_run_job_to_baton_run(cluster, tmp_path):
    """A job `baton run` started has no queue's record: recovering it into the queue would have a worker
    fence out the run (live or not) and run the job a second time. It is skipped, saying why; a queued
    job it does recover is marked as the queue's."""
    from tests.helpers import run_baton

    spec_path = write_spec(tmp_path, SPEC)
    run = _start(spec_path, cluster.storage_url, "mine", **cluster.env)
    kill_when(run, cluster.store(), "mine", lambda m: bool(m["checkpoints"]))
    done = run_baton("recover", "mine", env=cluster.env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a `baton run` job" in done.stdout + done.stderr, done.stdout + done.stderr
    assert not cluster.store().exists("jobs/mine/queued.json")
    again = run_baton("run", str(spec_path), "--id", "mine", "--storage", cluster.storage_url, "--no-progress",
                      env=cluster.env)
    assert again.returncode == 0, again.stdout + again.stderr  # still baton run's to finish
