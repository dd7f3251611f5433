"""The chaos suite at CI size: one job, two workers, three faults (a frozen holder taken over, Redis
killed and restarted from its AOF, the latest checkpoint's bytes corrupted and its holder
SIGKILLed). It must survive every fault and end bit-exact, losing no committed checkpoint and
accepting no commit from a fenced-out attempt."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, baton_env


@pytest.mark.slow
def test_a_small_chaos_run_survives_every_fault_bit_exact(tmp_path):
    out = tmp_path / "chaos.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--faults", "3", "--seed", "1",
                           "--kinds", "sigstop,redis,corrupt", "--workers", "2", "--out", str(out)],
                          env=baton_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert sorted(f["kind"] for f in result["faults"]) == ["corrupt", "redis", "sigstop"], done.stdout
    assert result["faults_injected"] == result["faults_survived"] == 3, done.stdout
    assert result["bit_exact"] and result["final_state"] == "succeeded", result["difference"]
    assert result["committed_checkpoints_lost"] == 0 and result["commits_by_fenced_attempts"] == 0, done.stdout
    assert result["attempts"] >= 3  # the frozen holder and the corrupted one were each replaced by a new attempt
    corrupt = next(f for f in result["faults"] if f["kind"] == "corrupt")
    assert corrupt["note"].startswith("overwrote jobs/chaos/attempt-"), corrupt
    assert result["manifest_polls"] > 0
