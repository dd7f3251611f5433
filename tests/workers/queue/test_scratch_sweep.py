"""A worker killed outright leaves its scratch directories (the checkpoint spool, TensorBoard's
local event files) in the temporary directory: the next worker started on the machine removes them,
and never those of a worker still running."""
from __future__ import annotations

import pytest

from pathlib import Path

from tests.helpers import kill_when, make_spec
from tests.workers.conftest import SPEC
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

SCRATCH_PREFIXES = ("baton-spool-", "baton-tensorboard-")
LONG = make_spec(**{**SPEC, "loop": {**SPEC["loop"], "epochs": 30}})  # still training when the test looks


def scratch_dirs(directory: Path) -> set[Path]:
    return {path for path in directory.iterdir() if path.is_dir() and path.name.startswith(SCRATCH_PREFIXES)}


def has_both(dirs: set[Path]) -> bool:
    return all(any(path.name.startswith(prefix) for path in dirs) for prefix in SCRATCH_PREFIXES)


@pytest.mark.slow
def test_a_killed_workers_scratch_is_removed_by_the_next_worker_and_a_live_ones_kept(cluster, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    live_worker, = cluster.start_workers(1, TMPDIR=str(tmp))
    live = cluster.client.submit(LONG, "live")
    wait_for(running_at_step(live, 1))
    live_dirs = wait_for(lambda: has_both(dirs := scratch_dirs(tmp)) and dirs)  # after its first row

    killed_worker, = cluster.start_workers(1, TMPDIR=str(tmp))
    cluster.client.submit(SPEC, "killed")
    kill_when(killed_worker.proc, cluster.store(), "killed",
              lambda manifest: manifest["metrics"] is not None and has_both(scratch_dirs(tmp) - live_dirs))
    left = scratch_dirs(tmp) - live_dirs
    assert has_both(left) and any(any(path.iterdir()) for path in left)  # a checkpoint or event file inside

    cluster.start_workers(1, TMPDIR=str(tmp))
    assert not (left & scratch_dirs(tmp)), f"a killed worker's scratch left behind: {sorted(left & scratch_dirs(tmp))}"
    assert live_dirs <= scratch_dirs(tmp), "a running worker's scratch was removed"
    assert live.status().state.value == "running" and live_worker.proc.poll() is None
