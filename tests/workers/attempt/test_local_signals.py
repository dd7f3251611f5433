"""`baton run`'s signals: the first stops at the next checkpoint, a second aborts (130), and once the
job has finished a signal only cuts the closing printout short: exit 0, the job is done."""
from __future__ import annotations

import os
import signal
import time

import pytest

from baton.workers.attempt.local import EXIT_DONE, LocalControl


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


def test_a_signal_after_the_job_finished_ends_with_exit_0(handlers):
    control = LocalControl("done", progress_bar=False)
    control.finished()
    with pytest.raises(SystemExit) as ended:
        _interrupt()
    assert ended.value.code == EXIT_DONE == 0


def test_before_it_finished_a_first_signal_asks_for_a_stop_and_a_second_aborts_with_130(handlers):
    control = LocalControl("running", progress_bar=False)
    _interrupt()
    assert control.stop_reason() == "interrupted"
    with pytest.raises(SystemExit) as ended:
        _interrupt()
    assert ended.value.code == 130
