"""The chaos suite at CI size: one job, two workers, seven faults (Redis killed and restarted from its
AOF, the latest checkpoint's bytes corrupted and its holder SIGKILLed, the holder's checkpoint writer
out of disk, a duplicate `baton run` of the job, /dev/shm swept from another pid namespace, the
holder's checkpoint writer SIGKILLed at every checkpoint, Redis killed as the job finalizes). It must survive
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
    done = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--faults", "7", "--seed", "1",
                           "--kinds", "redis,corrupt,fullspool,duprun,shmsweep,writerkill,finalize", "--workers", "2",
                           "--no-gang", "--out", str(out)],
                          env=baton_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert sorted(f["kind"] for f in result["faults"]) == ["corrupt", "duprun", "finalize", "fullspool", "redis",
                                                           "shmsweep", "writerkill"], done.stdout
    assert result["faults_injected"] == result["faults_survived"] == 7, done.stdout
    assert result["bit_exact"] and result["final_state"] == "succeeded", result["difference"]
    assert result["committed_checkpoints_lost"] == 0 and result["commits_by_fenced_attempts"] == 0, done.stdout
    assert result["attempts"] >= 4  # the corrupted holder, the one out of disk, the one whose writer died: replaced
    corrupt = next(f for f in result["faults"] if f["kind"] == "corrupt")
    assert corrupt["note"].startswith("overwrote jobs/chaos/attempt-"), corrupt
    duprun = next(f for f in result["faults"] if f["kind"] == "duprun")
    assert duprun["note"].startswith("baton run exited 4: job chaos was submitted to a queue"), duprun
    fullspool = next(f for f in result["faults"] if f["kind"] == "fullspool")
    assert fullspool["note"] == "given up as a loss, taken over", fullspool
    writerkill = next(f for f in result["faults"] if f["kind"] == "writerkill")  # a loss, counted
    assert "given up as a loss, taken over" in writerkill["note"], writerkill
    shmsweep = next(f for f in result["faults"] if f["kind"] == "shmsweep")  # nothing of the holder's taken
    assert shmsweep["attempt_after"] == shmsweep["attempt_before"], shmsweep
    assert result["manifest_polls"] > 0
    rank = result["rank_failure"]  # beside it: a job whose rank 1 raises fails once, with rank 1's traceback
    # failed, not retried as a loss (a Redis outage past the lease may have re-queued it uncounted first)
    assert (rank["state"], rank["lost"]) == ("failed", 0) and rank["rank_1_traceback"], rank
