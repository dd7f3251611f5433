"""A worker's forkserver (``baton.workers.attempt.preload``): how it ends when its worker does."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO

SCRIPT = """
import os, sys
from multiprocessing import forkserver
from baton.workers.attempt import process

if __name__ == "__main__":
    context = process.context()
    context.set_forkserver_preload(sys.argv[1].split(","))
    process.start_forkserver()
    child = context.Process(target=sys.exit, args=(3,))
    child.start()
    child.join()
    server = forkserver._forkserver._forkserver_pid
    os.close(forkserver._forkserver._forkserver_alive_fd)  # as the worker's end does
    print(child.exitcode, os.waitstatus_to_exitcode(os.waitpid(server, 0)[1]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("probe_first", [True, False])
def test_the_forkserver_ends_with_its_worker_running_its_exit_handlers_but_not_finalising_its_modules(tmp_path,
                                                                                                       probe_first):
    """Tearing down torch and the trackers' libraries cost every worker's stop ~2 s of a core. The exit
    handlers registered before baton's (multiprocessing's, the libraries') still run, once; where one was
    registered after it (the probe preloaded second), the interpreter finalises as usual rather than call
    that one twice. A training process's exit status is its own, the forkserver's 0."""
    order = ["tests.forkserver_exit_probe", "baton.workers.attempt.preload"]
    done = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(order if probe_first else order[::-1])],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PROBE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split()[-2:] == ["3", "0"], done.stdout + done.stderr  # the child's status; the server's
    marks = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert "atexit" in marks, f"the probe was not preloaded: {done.stderr}"
    assert len(marks["atexit"].split()) == 1, marks  # the forkserver's exit handlers ran, each once
    assert marks["finalised"] == ("" if probe_first else "finalised"), marks  # its modules torn down only then
