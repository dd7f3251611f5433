"""`baton run`'s signals: the first stops at the next checkpoint, a second aborts (130), and once the
job has finished signals are ignored: exit 0, the job is done."""
from __future__ import annotations

import os
import signal
import time

import pytest

from baton.workers.attempt.local import LocalControl


@pytest.fixture
def handlers():
    """LocalControl installs SIGINT and SIGTERM handlers: put pytest's back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _interrupt() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)  # the handler runs in this thread between two bytecodes, long before this ends


def test_a_signal_after_the_job_finished_is_ignored(handlers):
    control = LocalControl("done", progress_bar=False)
    control.finished()
    _interrupt()  # no exception: the process goes on to exit 0
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and control.stop_reason() is None


def test_before_it_finished_a_first_signal_asks_for_a_stop_and_a_second_aborts_with_130(handlers):
    control = LocalControl("running", progress_bar=False)
    _interrupt()
    assert control.stop_reason() == "interrupted"
    with pytest.raises(SystemExit) as ended:
        _interrupt()
    assert ended.value.code == 130


@pytest.mark.slow
def test_signals_from_the_finished_line_to_the_exit_do_not_turn_a_finished_job_into_130(tmp_path):
    """Ctrl-C pressed as `baton run` prints its end: the job is done, whatever the moment (late in the
    interpreter's shutdown the default handler would end the process with SIGINT's status)."""
    import subprocess

    from tests.helpers import BATON, REPO, baton_env, make_spec, write_spec

    spec = write_spec(tmp_path, make_spec(loop={"epochs": 1}, scheduler={"name": "none"}))
    run = subprocess.Popen([*BATON, "run", str(spec), "--id", "done", "--storage", f"file://{tmp_path / 'store'}",
                            "--no-progress"], env=baton_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
    for line in run.stdout:
        if "finished; artifacts under" in line:
            break
    while run.poll() is None:
        run.send_signal(signal.SIGINT)
        time.sleep(0.01)
    assert run.returncode == 0
