"""`baton worker --gpus/--concurrency` supervises one worker process per slot: a child that exits
with the stall watchdog's status (70) is started again, a bounded number of times; any other exit
leaves its slot empty. Real processes: a supervisor process running ``supervise()`` over small
child processes that exit as a worker would (the real exit 70 is tested in test_stall.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from baton.workers.queue.stall import EXIT_STALLED
from baton.workers.queue.worker_main import RESTART_EXIT_CODES

from tests.helpers import REPO, baton_env

# slot i appends a line to starts-i, then exits with the status its plan gives for this start, or runs
# until SIGTERM ("run", "run70": the status on SIGTERM)
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    index, plan, directory = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
    path = os.path.join(directory, f"starts-{index}")
    with open(path, "a") as fh:
        fh.write("x\\n")
    starts = len(open(path).read().split())
    exit_code = plan[min(starts, len(plan)) - 1]
    if exit_code.startswith("run"):  # run until SIGTERM, then exit with the status after "run" (0 by default)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(int(exit_code[3:] or 0)))
        while True:
            time.sleep(0.05)
    sys.exit(int(exit_code))
""")

SUPERVISOR = textwrap.dedent("""
    import sys
    from baton.workers.queue import worker_main
    worker_main.RESTARTS_MAX = int(sys.argv[3])
    plans, directory = sys.argv[1].split(";"), sys.argv[2]
    argv = lambda index: [sys.executable, "-c", {child!r}, str(index), plans[index], directory]
    sys.exit(worker_main.supervise("sup", "default", "info", [{{}} for _ in plans], argv=argv))
""")


def _supervisor(tmp_path: Path, plans: list[str], restarts_max: int = 5) -> subprocess.Popen:
    code = SUPERVISOR.format(child=CHILD)
    return subprocess.Popen([sys.executable, "-c", code, ";".join(plans), str(tmp_path), str(restarts_max)],
                            env=baton_env(), cwd=REPO, stderr=subprocess.PIPE, text=True)


def _starts(tmp_path: Path, index: int) -> int:
    path = tmp_path / f"starts-{index}"
    return len(path.read_text().split()) if path.exists() else 0


def _wait(predicate, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_a_stalled_child_is_started_again_and_other_exits_stand(tmp_path):
    assert RESTART_EXIT_CODES == {EXIT_STALLED}
    # slot 0 stalls twice then runs; slot 1 exits 3 at once (not a stall: its slot stays empty)
    sup = _supervisor(tmp_path, [f"{EXIT_STALLED},{EXIT_STALLED},run", "3"])
    _wait(lambda: _starts(tmp_path, 0) == 3)
    time.sleep(1.0)  # slot 1 would have been started again by now
    assert (_starts(tmp_path, 0), _starts(tmp_path, 1)) == (3, 1) and sup.poll() is None
    sup.send_signal(signal.SIGTERM)  # passed on: the running child exits 0
    assert sup.wait(timeout=30) == 3  # the highest exit of its children
    log = sup.stderr.read()
    assert log.count("sup-0 exited with status 70 (stalled); starting it again") == 2 and "sup-1" not in log


def test_restarts_of_a_slot_are_bounded(tmp_path):
    sup = _supervisor(tmp_path, [str(EXIT_STALLED)], restarts_max=2)  # a node where every job hangs
    assert sup.wait(timeout=30) == EXIT_STALLED
    assert _starts(tmp_path, 0) == 3  # the first start and two restarts
    assert "not restarting it" in sup.stderr.read()


def test_a_child_that_exits_70_after_sigterm_is_not_started_again(tmp_path):
    sup = _supervisor(tmp_path, [f"run{EXIT_STALLED}"])  # it stalls during the shutdown: no new child then
    _wait(lambda: _starts(tmp_path, 0) == 1)
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == EXIT_STALLED and _starts(tmp_path, 0) == 1
