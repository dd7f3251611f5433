"""bench/suite_cpu.py counts the CPU of every process below its command, a process its parent never
reaped included (a worker's forkserver is one: ``time`` misses it and all it forked)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import REPO

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
ORPHANING = ("import subprocess, sys\n"
             f"subprocess.Popen([sys.executable, '-c', {BURN!r}], start_new_session=True)\n"  # not waited for
             "done = subprocess.run([sys.executable, '-m', 'baton', '--help'], capture_output=True, text=True, check=True)\n"
             "assert not done.stderr, done.stderr")  # what suite_cpu sets for its command is no baton setting of a typo


def test_suite_cpu_counts_an_unreaped_grandchild_and_sorts_processes_by_kind_and_test(tmp_path):
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "suite_cpu.py"), "--every", "0.02", "--out", str(out),
                           "--", sys.executable, "-c", ORPHANING], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTEST_CURRENT_TEST": "tests/t.py::test_it (call)"})
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["by_kind"]["baton CLI, other commands"]["processes"] == 1, result["by_kind"]
    burner = [p for p in result["processes"] if "process_time" in p["cmd"] and "Popen" not in p["cmd"]]
    assert len(burner) == 1 and burner[0]["cpu_s"] >= 0.4, burner  # it ended after the command did
    assert result["by_test"]["tests/t.py::test_it"] >= 0.4, result["by_test"]  # what the test started, by its name
    assert "all of the command" in done.stdout and "baton CLI, other commands" in done.stdout


def test_suite_cpu_charges_a_test_the_cpu_it_spent_in_its_pytest_process(tmp_path):
    """The tests' conftest writes each test's CPU in its own pytest process where suite_cpu asks it to."""
    test_file = tmp_path / "test_burn.py"
    test_file.write_text(f"def test_burn():\n    {BURN.replace(chr(10), chr(10) + '    ')}\n\ndef test_idle():\n    pass\n")
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "suite_cpu.py"), "--every", "0.05", "--out", str(out),
                           "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(tmp_path), str(test_file)],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    inside = json.loads(out.read_text())["in_pytest_by_test"]
    assert inside["test_burn.py::test_burn"] >= 0.4, inside
    assert inside.get("test_burn.py::test_idle", 0.0) < 0.2, inside
