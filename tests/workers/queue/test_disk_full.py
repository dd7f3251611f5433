"""A worker whose machine cannot write a checkpoint's local copy (a full disk) gives the job up as a
worker loss, to be resumed elsewhere from its last committed checkpoint: the job is not failed as if
its own code had raised. The worker runs under a file-size limit (RLIMIT_FSIZE), so that writing the
spooled checkpoint file fails as a full disk does, with an OSError inside torch.save (each snapshot
buffer, one tensor, stays under the limit)."""
from __future__ import annotations

import pytest

import sys
from dataclasses import dataclass

from baton.jobs.services import WorkerProcess
from tests.helpers import make_spec
from tests.conftest import WORKER_READY_S

LIMIT = 1536 << 10
"""Bytes a file written by the worker may hold: more than its largest tensor (1 MiB), less than a
whole checkpoint (about 3 MiB)."""

BIG = make_spec(model={"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 512, "layers": 2,
                                                           "out_features": 3}},
                loop={"epochs": 1}, scheduler={"name": "none"}, retry={"max_attempts": 2})

LIMITED = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({0}, {0})); "
           "os.execv(sys.executable, [sys.executable, '-m', 'baton', *sys.argv[1:]])")


@dataclass
class LimitedWorker(WorkerProcess):
    """A `baton worker` that may not write a file past LIMIT bytes (Python ignores SIGXFSZ: a write
    past the limit fails with EFBIG, as one on a full disk fails with ENOSPC)."""

    def start(self) -> "LimitedWorker":
        import subprocess

        from baton.jobs.services import die_with_parent

        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-c", LIMITED.format(LIMIT), "worker", "--name", self.name,
                                      "--queues", self.queues], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        return self


@pytest.mark.slow
def test_a_checkpoint_the_disk_cannot_hold_is_a_worker_loss_not_the_jobs_failure(cluster):
    worker = LimitedWorker("full@test", {"BATON_METRICS_PORT": "0", **cluster.env},
                           str(cluster.log_dir / "full.log")).start()
    cluster.workers.append(worker)
    worker.wait_ready(WORKER_READY_S)
    job = cluster.client.submit(BIG, "full-disk")
    final = job.wait(timeout=180, progress=False)
    # both attempts were given up as losses (one retry), each saying why: nothing blamed on the job's code
    assert final.state.value == "failed" and final.attempt == 2 and final.lost == 2, final
    assert "could not write the checkpoint file" in final.error and "File too large" in final.error, final.error
    assert "lost 2 time(s), retry.max_attempts reached" in final.error
    assert "full@test" in final.error


@pytest.mark.slow
def test_a_store_that_cannot_take_the_checkpoint_is_the_machines_fault_under_baton_run(tmp_path):
    """An OSError where the checkpoint's object goes (here a directory in its place, as a full disk or
    a broken mount would fail the write) is this machine's: `baton run` says the job did not fail."""
    from tests.helpers import run_baton, write_spec

    store = tmp_path / "store"
    blocker = store / "jobs" / "blocked" / "attempt-1" / "checkpoints" / "step-5.pt"
    (blocker / "in-the-way").mkdir(parents=True)
    spec = make_spec(loop={"epochs": 1}, scheduler={"name": "none"})
    done = run_baton("run", str(write_spec(tmp_path, spec)), "--id", "blocked", "--storage", f"file://{store}",
                     "--no-progress")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "could not write checkpoint jobs/blocked/attempt-1/checkpoints/step-5.pt" in done.stderr, done.stderr
    assert "the job did not fail: free some space and run again with --id blocked" in done.stderr
