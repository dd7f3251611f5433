"""The scheduler preempts for free: with every worker busy, a job of higher priority (or of a team below
its quota) makes one running job yield. The yielded job checkpoints at its next step, is re-queued
uncounted, redoes no step (counted by the user's own model) and ends bit-equal to a run never
interrupted; the other running job is never touched."""
from __future__ import annotations

import time

import pytest

from tests.helpers import assert_same_training, make_spec, run_baton, run_reference, wait_for_turns
from tests.probes import first_forward_at, forwards_counted
from tests.workers.queue.test_worker_loss import running_at_step, wait_for


def counted(directory, **resources) -> dict:
    # ~0.4 s an epoch (slow data), 30 epochs: long enough to be running when the other job arrives
    return make_spec(model={"target": "tests.probes:counting_mlp", "kwargs": {"directory": str(directory)}},
                     data={"target": "tests.probes:slow_spiral", "batch_size": 32,
                           "kwargs": {"n_per_class": 100, "delay_s": 0.0015}},
                     loop={"epochs": 30}, resources=resources)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The low-priority jobs' spec run uninterrupted, and the forwards its model made (once a module)."""
    root = tmp_path_factory.mktemp("reference")
    directory = root / "forwards"
    directory.mkdir()
    store = run_reference(root / "run", counted(directory))
    return store, sum(forwards_counted(str(directory)).values())


def _dirs(tmp_path, *names):
    made = []
    for name in names:
        (tmp_path / name).mkdir()
        made.append(tmp_path / name)
    return made


def _check_yielded(cluster, job, directory, reference, reason: str):
    store, reference_forwards = reference
    final = job.status()
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 0), final  # one yield: not a loss
    assert sum(forwards_counted(str(directory)).values()) == reference_forwards  # 0 steps redone
    assert_same_training(store, "reference", cluster.store(), job.id)
    raw = cluster.client.records.raw(job.id)
    assert "yield_requested" not in raw


@pytest.mark.slow
def test_a_higher_priority_job_makes_the_lowest_one_yield_and_starts_within_10_s(cluster, tmp_path, reference):
    cluster.start_workers(2)
    client = cluster.client
    low_a, low_b, urgent_dir = _dirs(tmp_path, "low-a", "low-b", "urgent")
    lows = [client.submit(counted(low_a), "low-a"), client.submit(counted(low_b), "low-b")]
    for job in lows:
        wait_for(running_at_step(job, 5), timeout=120)

    urgent_spec = counted(urgent_dir, priority=10)
    urgent_spec["loop"]["epochs"] = 2
    submitted = time.time()
    urgent = client.submit(urgent_spec, "urgent")
    final = urgent.wait(timeout=120, progress=False)
    assert final.state.value == "succeeded", final.error
    started_in = first_forward_at(str(urgent_dir)) - submitted
    assert started_in <= 10, started_in

    finals = [job.wait(timeout=240, progress=False) for job in lows]
    yielded = [s for s in finals if s.attempt == 2]
    assert len(yielded) == 1, finals
    assert yielded[0].last_event.startswith("yielded to job urgent (priority 10) on "), yielded[0].last_event
    other = next(s for s in finals if s.attempt == 1)
    assert other.state.value == "succeeded" and other.last_event is None, other
    job, directory = (lows[0], low_a) if yielded[0].id == "low-a" else (lows[1], low_b)
    _check_yielded(cluster, job, directory, reference, "yielded to job urgent (priority 10)")


@pytest.mark.slow
def test_a_team_below_its_quota_reclaims_a_borrowed_slot(cluster, tmp_path, reference):
    cluster.start_workers(2)
    client = cluster.client
    for team in ("a", "b"):
        client.set_quota(team, "default", 1)
    a1_dir, a2_dir, b1_dir = _dirs(tmp_path, "a1", "a2", "b1")
    team_a = [client.submit(counted(a1_dir, team="a"), "a1"), client.submit(counted(a2_dir, team="a"), "a2")]
    for job in team_a:  # both of team a's jobs run: one on its quota, one borrowed
        wait_for(running_at_step(job, 5), timeout=120)

    b_spec = counted(b1_dir, team="b")
    b_spec["loop"]["epochs"] = 2
    submitted = time.time()
    b1 = client.submit(b_spec, "b1")
    assert b1.wait(timeout=120, progress=False).state.value == "succeeded"
    assert first_forward_at(str(b1_dir)) - submitted <= 10

    finals = [job.wait(timeout=240, progress=False) for job in team_a]
    yielded = [s for s in finals if s.attempt == 2]
    assert len(yielded) == 1, finals
    assert yielded[0].last_event.startswith("team a's slot reclaimed by team b on "), yielded[0].last_event
    job, directory = (team_a[0], a1_dir) if yielded[0].id == "a1" else (team_a[1], a2_dir)
    _check_yielded(cluster, job, directory, reference, "reclaimed")


@pytest.mark.slow
def test_a_drained_worker_yields_its_job_and_takes_no_other_until_undrained(cluster, tmp_path, reference):
    worker, = cluster.start_workers(1)
    client = cluster.client
    directory, = _dirs(tmp_path, "drained")
    job = client.submit(counted(directory), "drained-job")
    wait_for(running_at_step(job, 5), timeout=120)

    unknown = run_baton("drain", "nobody", env=cluster.env)
    assert unknown.returncode == 2 and unknown.stderr.startswith("no live worker is named 'nobody'"), unknown
    drained = run_baton("drain", worker.name.split("@")[0], env=cluster.env)
    assert drained.returncode == 0 and drained.stdout.strip() == f"worker {worker.name}: drained", drained
    wait_for(lambda: job.status().state.value == "retrying", timeout=60)  # yielded: back in its line
    # the drained worker takes nothing, not even the job it gave back: it hands its message back and holds
    wait_for(lambda: "drained: taking no job until `baton undrain" in worker.log(), timeout=30, what="the hold")
    wait_for_turns(cluster.redis_url, 4)
    status = job.status()
    assert status.state.value == "retrying" and status.position == 1, status
    shown = run_baton("queue", env=cluster.env)
    assert f"drained: {worker.name}" in shown.stdout.splitlines()[0], shown.stdout

    undrained = run_baton("undrain", worker.name, env=cluster.env)
    assert undrained.returncode == 0 and "takes jobs again" in undrained.stdout, undrained
    assert job.wait(timeout=180, progress=False).state.value == "succeeded"
    assert f"released (drained on {worker.name}), queued as attempt 2" in worker.log()
    _check_yielded(cluster, job, directory, reference, "drained")


@pytest.mark.slow
def test_a_reclaim_that_would_be_undone_is_not_made_and_nothing_yields_back_and_forth(cluster, tmp_path):
    """The thrash case: team a borrows team b's slot with priority-5 jobs; team b's priority-0 job waits.
    Reclaiming the slot would be undone (the yielded priority-5 job starts first again, and would take
    it back), so no turn asks anyone to yield: over many turns every job keeps its first attempt, and
    team b's job starts when a slot frees."""
    cluster.start_workers(2)
    client = cluster.client
    for team in ("a", "b"):
        client.set_quota(team, "default", 1)
    a1_dir, a2_dir, b1_dir = _dirs(tmp_path, "a1", "a2", "b1")
    short = {}
    for name, directory, team, priority in (("a1", a1_dir, "a", 5), ("a2", a2_dir, "a", 5), ("b1", b1_dir, "b", 0)):
        short[name] = counted(directory, team=team, priority=priority)
        short[name]["loop"]["epochs"] = 12
    team_a = [client.submit(short["a1"], "a1"), client.submit(short["a2"], "a2")]
    for job in team_a:
        wait_for(running_at_step(job, 5), timeout=120)
    b1 = client.submit(short["b1"], "b1")
    wait_for_turns(cluster.redis_url, 8)
    assert b1.status().state.value == "queued" and b1.status().position == 1, b1.status()
    assert [job.status().attempt for job in team_a] == [1, 1]
    finals = [job.wait(timeout=240, progress=False) for job in (*team_a, b1)]
    assert [(s.state.value, s.attempt, s.lost) for s in finals] == [("succeeded", 1, 0)] * 3, finals
    assert all("yield" not in (s.last_event or "") for s in finals), finals
