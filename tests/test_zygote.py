"""The tests' forked `baton` commands (tests/zygote.py) behave as new interpreters do where the tests look:
exit status, output, their own session, signals, and the bits a `baton run` trains."""
from __future__ import annotations

import os
import signal

import pytest

from tests import zygote
from tests.helpers import assert_same_training, baton_env, make_spec, run_baton, start_baton, wait_for, write_spec


def test_a_forked_command_says_and_exits_as_a_new_interpreter(tmp_path):
    bad = write_spec(tmp_path, {**make_spec(), "loop": {"epochs": "many"}})
    forked, fresh = run_baton("validate", str(bad)), run_baton("validate", str(bad), fresh=True)
    assert zygote.zygote() is not None, "the tests' zygote did not start"
    assert forked.returncode == fresh.returncode == 2
    assert (forked.stdout, forked.stderr) == (fresh.stdout, fresh.stderr) and "loop.epochs" in forked.stderr


def test_a_forked_command_runs_in_its_own_session_and_dies_of_the_signal_it_is_sent(tmp_path):
    log = tmp_path / "log"
    spec = write_spec(tmp_path, make_spec(loop={"epochs": 200}))
    proc = start_baton("run", str(spec), "--id", "long", "--storage", f"file://{tmp_path / 'store'}", log=log)
    assert isinstance(proc, zygote.Forked)
    assert os.getsid(proc.pid) == proc.pid  # a session (and process group) of its own, as start_new_session
    wait_for(lambda: "step" in log.read_text() or "epoch" in log.read_text(), timeout=60, what="the run to start")
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def test_an_environment_that_differs_where_an_interpreter_reads_it_starts_a_new_interpreter():
    server = zygote.zygote()
    assert server is not None
    assert server.serves(["status"], dict(zygote.SERVER_ENV))
    assert server.serves(["run"], baton_env())  # what the tests' commands get (this process's environment now)
    # set in this process by the libraries (torch once it traced, scikit-learn once it loaded a data set)
    assert server.serves(["run"], {**zygote.SERVER_ENV, "TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_x"})
    assert server.serves(["run"], {**zygote.SERVER_ENV, "KMP_DUPLICATE_LIB_OK": "True", "KMP_INIT_AT_FORK": "FALSE"})
    assert not server.serves(["status"], {**zygote.SERVER_ENV, "PYTHONPATH": "/elsewhere"})
    assert not server.serves(["status"], {**zygote.SERVER_ENV, "OMP_NUM_THREADS": "7"})
    assert not server.serves(["worker", "--name", "w"], dict(zygote.SERVER_ENV))  # a worker's main holds no torch


@pytest.mark.slow
def test_a_forked_baton_run_trains_the_same_bits_as_a_new_interpreter(tmp_path):
    from baton.storage.stores.file_store import FileStore

    spec = write_spec(tmp_path, make_spec(loop={"epochs": 2}))
    for job_id, fresh in (("forked", False), ("fresh", True)):
        done = run_baton("run", str(spec), "--id", job_id, "--storage", f"file://{tmp_path / 'store'}", fresh=fresh)
        assert done.returncode == 0, done.stdout + done.stderr
    store = FileStore(tmp_path / "store")
    assert_same_training(store, "forked", store, "fresh")


def _signal_state(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as fh:
        return {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k in ("SigBlk", "SigIgn", "SigCgt")}


@pytest.mark.slow
def test_a_forked_baton_run_handles_signals_as_a_new_interpreter_and_sigterm_stops_it_with_3(tmp_path):
    """The signals it blocks, ignores and catches while it trains are a new interpreter's, and SIGTERM
    checkpoints and ends it with exit 3 either way."""
    spec = write_spec(tmp_path, make_spec(loop={"epochs": 200}))
    runs = {}
    for name, fresh in (("forked", False), ("fresh", True)):
        log = tmp_path / f"{name}.log"
        proc = start_baton("run", str(spec), "--id", name, "--storage", f"file://{tmp_path / 'store'}", "--no-progress",
                           log=log, fresh=fresh)
        assert isinstance(proc, zygote.Forked) != fresh
        runs[name] = (proc, log)
    for name, (proc, log) in runs.items():
        wait_for(lambda: "epoch" in log.read_text() or proc.poll() is not None, timeout=120, what=f"the {name} run")
        assert proc.poll() is None, log.read_text()
    assert _signal_state(runs["forked"][0].pid) == _signal_state(runs["fresh"][0].pid)
    for proc, _ in runs.values():
        proc.send_signal(signal.SIGTERM)
    for name, (proc, log) in runs.items():
        assert proc.wait(timeout=120) == 3, f"{name}: {log.read_text()}"
