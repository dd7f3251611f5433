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
    context.set_forkserver_preload(["baton.workers.attempt.preload", "tests.forkserver_exit_probe"])
    process.start_forkserver()
    child = context.Process(target=sys.exit, args=(3,))
    child.start()
    child.join()
    server = forkserver._forkserver._forkserver_pid
    os.close(forkserver._forkserver._forkserver_alive_fd)  # as the worker's end does
    print(child.exitcode, os.waitstatus_to_exitcode(os.waitpid(server, 0)[1]))
"""


@pytest.mark.slow
def test_the_forkserver_ends_with_its_worker_running_its_exit_handlers_but_not_finalising_its_modules(tmp_path):
    """Tearing down torch and the trackers' libraries cost every worker's stop ~2 s of a core; the exit
    handlers (multiprocessing's, the libraries') still run, and a training process's exit status is its own."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={"PROBE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["3", "0"], done.stdout + done.stderr  # the child's status; the server's
    marks = {path.name: path.read_text() for path in tmp_path.iterdir()}
    assert marks["atexit"].isdigit(), marks  # the forkserver's exit handlers ran
    assert marks["finalised"] == "", marks  # its modules were not torn down
