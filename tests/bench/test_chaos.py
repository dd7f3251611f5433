"""The chaos suite at CI size: one job, two workers, five faults (Redis killed and restarted from its
AOF, the latest checkpoint's bytes corrupted and its holder SIGKILLed, the holder's checkpoint writer
out of disk, a duplicate `baton run` of the job, Redis killed as the job finalizes). It must survive
every fault and end bit-exact, losing no committed checkpoint and accepting no commit from a
fenced-out attempt."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, baton_env


@pytest.mark.slow
def test_a_small_chaos_run_survives_every_fault_bit_exact(tmp_path):
    out = tmp_path / "chaos.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--faults", "5", "--seed", "1",
                           "--kinds", "redis,corrupt,fullspool,duprun,finalize", "--workers", "2", "--out", str(out)],
                          env=baton_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert sorted(f["kind"] for f in result["faults"]) == ["corrupt", "duprun", "finalize", "fullspool", "redis"], \
        done.stdout
    assert result["faults_injected"] == result["faults_survived"] == 5, done.stdout
    assert result["bit_exact"] and result["final_state"] == "succeeded", result["difference"]
    assert result["committed_checkpoints_lost"] == 0 and result["commits_by_fenced_attempts"] == 0, done.stdout
    assert result["attempts"] >= 3  # the corrupted holder and the one out of disk were each replaced
    corrupt = next(f for f in result["faults"] if f["kind"] == "corrupt")
    assert corrupt["note"].startswith("overwrote jobs/chaos/attempt-"), corrupt
    duprun = next(f for f in result["faults"] if f["kind"] == "duprun")
    assert duprun["note"].startswith("baton run exited 4: job chaos was submitted to a queue"), duprun
    fullspool = next(f for f in result["faults"] if f["kind"] == "fullspool")
    assert fullspool["note"] == "given up as a loss, taken over", fullspool
    assert result["manifest_polls"] > 0
    rank = result["rank_failure"]  # beside it: a job whose rank 1 raises fails once, with rank 1's traceback
    # failed, not retried as a loss (a Redis outage past the lease may have re-queued it uncounted first)
    assert (rank["state"], rank["lost"]) == ("failed", 0) and rank["rank_1_traceback"], rank
