"""bench/pool.py's CI-sized case, which is also the fair-share test: two teams with equal quotas on two
real workers, team a's jobs submitted first, share the slots while both have work (first come, first
served would give team a both); and a job of higher priority trains within 10 s of its submit while
the job that yields to it redoes nothing (counted by the jobs' own model)."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO


def test_the_pool_bench_shares_fairly_and_preempts_for_free(tmp_path):
    out = tmp_path / "pool.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "pool.py"), "--trials", "1", "--jobs", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    [trial] = result["priority"]
    assert trial["succeeded"] and trial["yielded"] == 1 and trial["redone"] == [0], json.dumps(trial)  # (its events say why)
    assert trial["start_s"] <= 10, trial
    assert "yielded to job urgent-" in trial["events"][0]
    share = result["fair_share"]
    assert share["share_error"] <= 0.15, share
