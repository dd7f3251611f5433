"""Multi-node jobs (resources.nodes) through real `baton worker` processes standing for nodes on one
machine (distinct by name, loopback rendezvous): one group across the workers, equal to the same
ranks on one node; a node's worker SIGKILLed, the gang formed again with a spare and the run
bit-exact; a gang that cannot fill released without using an attempt."""
from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, baton_env, mid_epoch_after_two_checkpoints, run_reference
from tests.workers.parallel.test_ddp import alive
from tests.workers.parallel.test_ddp_workers import sigkill_worker_pid_when
from tests.workers.parallel.test_fsdp import FSDP, assert_same_sharded_training
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory):
    """test_fsdp's job on one node, uninterrupted: 2 ranks, as the 2 nodes of 1 rank here."""
    return run_reference(tmp_path_factory.mktemp("fsdp-reference"), FSDP)

# test_fsdp's job (2 sharded ranks) as 2 nodes of 1 rank each: the same world, so the same bits
TWO_NODES = {**FSDP, "resources": {**FSDP["resources"], "processes": 1, "nodes": 2}}
NODES_ENV = {"BATON_GANG_DISTINCT": "worker", "BATON_NODE_ADDRESS": "127.0.0.1"}


def gang_of(cluster, job_id: str):
    from baton.storage.records.gangs import Gangs

    return Gangs(cluster.client.records.redis).read(job_id)


@pytest.mark.slow
def test_a_gang_that_cannot_fill_is_released_without_using_an_attempt_then_two_nodes_train_as_one(
        cluster, fsdp_reference, tmp_path):
    """One node of two: the gang is released, the job stays queued with no attempt used. Once a second
    node starts, the two train as one group, equal to the same ranks on one node."""
    cluster.start_workers(1, BATON_GANG_TIMEOUT_S="2", **NODES_ENV)
    job = cluster.client.submit(TWO_NODES, "alone")
    waiting = wait_for(lambda: (s := job.status()).last_event and "only 1 of 2 joined" in s.last_event and s, timeout=60)
    assert (waiting.state.value, waiting.attempt, waiting.lost) == ("queued", 0, 0)
    cluster.start_workers(1, BATON_GANG_TIMEOUT_S="30", **NODES_ENV)
    final = job.wait(timeout=240, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (1, 0)
    # the leader dissolves its gang once its attempt has ended: after the job's record says so
    wait_for(lambda: (gang := gang_of(cluster, "alone")) is None or gang.state == "dissolved", timeout=30)
    assert_same_sharded_training(fsdp_reference, "reference", cluster.store(), "alone", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("job_user", ["worker", ""], ids=["as-the-worker", "as-its-own-user"])
def test_sigterm_on_a_node_stops_every_rank_at_one_step_and_loses_nothing(cluster, fsdp_reference, tmp_path, job_user):
    """SIGTERM to the follower's worker: it passes it to its rank, the whole group agrees to stop at
    the next step, one stop checkpoint is committed by the leader and the job goes back to the queue
    uncounted; a spare joins the leader and the run ends bit-exact. Also where every node runs the job as
    a user of its own (a root worker's default): the spare's ranks, forked from its forkserver as that
    user, read the sharded checkpoint its worker fetched for them."""
    import signal

    from tests.helpers import read_manifest, uid_of
    from tests.workers.parallel.test_ddp_workers import rank_pids

    cluster.start_workers(2, BATON_JOB_USER=job_user, **NODES_ENV)
    job = cluster.client.submit(TWO_NODES, "term")
    store = cluster.store()
    wait_for(lambda: (m := read_manifest(store, "term")) and any(e["kind"] == "step" for e in m["checkpoints"]))
    follower = cluster.worker(gang_of(cluster, "term").workers[1])
    if job_user == "":  # the leader's training process and the follower's rank: each node's worker's own uid
        users = {uid_of(job.status().pid), *map(uid_of, wait_for(lambda: rank_pids(follower), timeout=30))}
        assert 0 not in users and len(users) == 2, users
    follower.signal(signal.SIGTERM, group=False)
    stopped = wait_for(lambda: (m := read_manifest(store, "term")) and m["checkpoints"][-1]["kind"] == "stop" and m,
                       timeout=60)
    assert follower.proc.wait(timeout=60) is not None
    cluster.start_workers(1, BATON_JOB_USER=job_user, **NODES_ENV)
    final = job.wait(timeout=240, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.lost == 0 and final.resumed_from == stopped["checkpoints"][-1]["step"]  # 0 steps lost
    assert_same_sharded_training(fsdp_reference, "reference", store, "term", tmp_path)


@pytest.mark.slow
def test_the_job_code_failing_on_another_node_fails_the_job_once_with_its_traceback(cluster):
    import re

    from tests.helpers import make_spec

    # a lease of 10 s, not 3: the test counts attempts, and on a loaded machine a leader's heartbeat once
    # went 3 s without a renewal while its gang started, so the job was re-queued (a loss) before it failed
    cluster.start_workers(2, BATON_LEASE_TTL_S="10", **NODES_ENV)
    spec = make_spec(data={"target": "tests.probes:failing_on_rank", "batch_size": 16,
                           "kwargs": {"n_per_class": 150, "rank": 1, "after": 40}},
                     loop={"epochs": 1}, checkpoint={"every_steps": 2}, retry={"max_attempts": 3},
                     resources={"processes": 1, "nodes": 2, "strategy": "fsdp"})
    final = cluster.client.submit(spec, "bad").wait(timeout=180, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 1, 0), final.error
    assert re.match(r"ValueError: sample \d+ is unreadable on rank 1 \(on rank 1 of 2\)", final.error), final.error
    assert re.search(r"tests/probes\.py.*ValueError: sample \d+ is unreadable on rank 1", final.traceback, re.S)


@pytest.mark.slow
def test_two_gangs_on_two_workers_both_finish(cluster):
    """Two jobs of 2 nodes submitted at once to a queue of 2 workers: were each to take one worker and
    wait for another, neither would ever start. One gang forms at a time, so one runs, then the other."""
    cluster.start_workers(2, **NODES_ENV)
    short = {**TWO_NODES, "loop": {**TWO_NODES["loop"], "epochs": 1}}
    jobs = [cluster.client.submit(short, name) for name in ("first", "second")]
    finals = [job.wait(timeout=240, progress=False) for job in jobs]
    assert [(f.state.value, f.attempt, f.lost) for f in finals] == [("succeeded", 1, 0)] * 2, [f.error for f in finals]


def mid_epoch_after_two_checkpoints_past(step: int):
    """``mid_epoch_after_two_checkpoints`` among the checkpoints past ``step`` (those of a resumed attempt)."""
    ready = mid_epoch_after_two_checkpoints()
    return lambda manifest: ready({**manifest, "checkpoints": [e for e in manifest["checkpoints"] if e["step"] > step]})


@pytest.mark.slow
def test_a_node_then_the_leader_sigkilled_the_gang_forms_again_each_time_and_ends_bit_exact(cluster, fsdp_reference,
                                                                                           tmp_path):
    """The follower's worker SIGKILLed mid-epoch (its rank dies with it, the leader's collective fails):
    the attempt is lost, the job re-queued; the leader and a spare form the next gang, which resumes from
    the last sharded checkpoint. Then that gang's leader is SIGKILLed mid-epoch (its rank 0 dies with it):
    the follower's rank is stopped by its worker (the gang expires without its leader), the job's lease
    lapses and a reaper queues it again; the follower and a second spare form the third gang, which
    resumes from the latest checkpoint and ends equal to the uninterrupted run, with no rank left."""
    from tests.workers.parallel.test_ddp_workers import rank_pids

    store = cluster.store()
    cluster.start_workers(2, **NODES_ENV)
    job = cluster.client.submit({**TWO_NODES, "retry": {"max_attempts": 5}}, "cut")
    wait_for(running_at_step(job, 1))
    follower = cluster.worker(gang_of(cluster, "cut").workers[1])
    first_ranks = wait_for(lambda: rank_pids(follower), timeout=30)
    first_cut = sigkill_worker_pid_when(follower, store, "cut", mid_epoch_after_two_checkpoints())
    wait_for(lambda: not any(alive(pid) for pid in first_ranks), timeout=30)  # its rank died with its worker alone
    resumed = first_cut["checkpoints"][-1]["step"]
    cluster.start_workers(1, **NODES_ENV)  # the first spare

    # a claim leaves the last attempt's step and resumed_from in the record until the new one has loaded its
    # checkpoint: wait for the resume itself
    second = wait_for(lambda: (s := job.status()).state.value == "running" and s.attempt >= 2 and s.resumed_from
                      and s, timeout=180)
    assert (second.lost, second.resumed_from) == (1, resumed), second
    holder = cluster.worker(second.worker)
    second_follower = cluster.worker(gang_of(cluster, "cut").workers[1])
    assert follower not in (holder, second_follower) and holder is not second_follower
    follower_ranks = wait_for(lambda: rank_pids(second_follower), timeout=30)
    for pid in follower_ranks:  # forked from the follower's forkserver, which imported torch once, at its start
        assert_forked_by_forkserver_of(pid, second_follower.proc.pid)
    second_cut = sigkill_worker_pid_when(holder, store, "cut", mid_epoch_after_two_checkpoints_past(resumed))
    wait_for(lambda: not any(alive(pid) for pid in follower_ranks), timeout=30)  # no orphan on the follower
    cluster.start_workers(1, **NODES_ENV)  # the second spare

    final = job.wait(timeout=240, progress=False)
    assert final.state.value == "succeeded", final.error
    assert final.lost == 2 and final.attempt >= 3 and final.resumed_from == second_cut["checkpoints"][-1]["step"]
    assert_same_sharded_training(fsdp_reference, "reference", store, "cut", tmp_path)
    assert not any(alive(worker.proc.pid) for worker in (follower, holder))


def assert_forked_by_forkserver_of(pid: int, worker_pid: int) -> None:
    """``pid`` is a rank forked from the forkserver of the worker ``worker_pid``, not a new interpreter."""
    from pathlib import Path

    def stat(of: int) -> tuple[str, int]:  # its name and its parent's pid
        text = Path(f"/proc/{of}/stat").read_text()
        return text[text.index("(") + 1:text.rindex(")")], int(text[text.rindex(")") + 2:].split()[1])

    name, parent = stat(pid)
    cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert name == "baton-rank" and "multiprocessing.forkserver" in cmdline, (name, cmdline)
    assert stat(parent)[1] == worker_pid, "the rank's forkserver is not its worker's"


def rendezvous_endpoints(cluster) -> list[str]:
    """Every rendezvous a multi-node leader served so far, as the workers' logs say."""
    found = []
    for log in sorted(cluster.log_dir.glob("w*.log")):
        found += re.findall(r"rendezvous at (\S+:\d+)", log.read_text(errors="replace"))
    return found


@pytest.mark.slow
def test_a_stranger_at_a_resumed_gangs_rendezvous_gets_nothing_and_the_job_ends_bit_exact(cluster, fsdp_reference,
                                                                                          tmp_path):
    """The resumed gang loads its sharded checkpoint over the checkpoint group (DCP's planning
    unpickles what that group's peers send). A stranger who knows only the leader's rendezvous port
    keeps writing its own address into rank 1's place there: it never joins and nothing it sent
    runs; the attempt it met proceeds without it or ends as a loss, and the job ends bit-exact."""
    marker = tmp_path / "a-rank-ran-the-strangers-code"
    cluster.start_workers(2, **NODES_ENV, BATON_RENDEZVOUS_TIMEOUT_S="20")
    job = cluster.client.submit({**TWO_NODES, "retry": {"max_attempts": 8}}, "guarded")
    wait_for(running_at_step(job, 1))
    first = rendezvous_endpoints(cluster)
    follower = cluster.worker(gang_of(cluster, "guarded").workers[1])
    committed = sigkill_worker_pid_when(follower, cluster.store(), "guarded", mid_epoch_after_two_checkpoints())
    stranger = subprocess.Popen([sys.executable, "-m", "tests.intruder", "steal-slot", str(tmp_path), str(marker), "25"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=baton_env())
    try:
        cluster.start_workers(1, **NODES_ENV, BATON_RENDEZVOUS_TIMEOUT_S="20")  # the spare
        endpoint = wait_for(lambda: next((e for e in rendezvous_endpoints(cluster) if e not in first), None),
                            timeout=120, every=0.005)
        (tmp_path / "endpoint").write_text(endpoint)
        final = job.wait(timeout=300, progress=False)
        out, err = stranger.communicate(timeout=60)
    finally:
        if stranger.poll() is None:
            stranger.kill()
            stranger.wait()
    assert not marker.exists(), "a rank unpickled the stranger's payload"
    assert not out.strip().startswith("joined"), (out, err[-2000:])
    assert final.state.value == "succeeded", final.error
    assert final.lost >= 1 and final.resumed_from == committed["checkpoints"][-1]["step"], final
    assert_same_sharded_training(fsdp_reference, "reference", cluster.store(), "guarded", tmp_path)


@pytest.mark.slow
def test_a_place_freed_while_a_gang_forms_is_offered_again_at_once(cluster):
    """A 3-node gang forms with its leader and one follower; the follower's worker is SIGTERMed and
    leaves. Two spare workers then start: the freed place must be offered again, so that both join
    and the gang is admitted (before, one spare took the last join message and the other idled
    while the gang waited out its whole timeout)."""
    three = {**TWO_NODES, "resources": {**TWO_NODES["resources"], "nodes": 3}}
    leader, follower = cluster.start_workers(2, **NODES_ENV)
    job = cluster.client.submit(three, "refill")
    wait_for(lambda: (gang := gang_of(cluster, "refill")) is not None and gang.joined == 2, timeout=60, every=0.02)
    follower.signal(signal.SIGTERM, group=False)
    wait_for(lambda: gang_of(cluster, "refill").joined == 1, timeout=30, every=0.02)
    cluster.start_workers(2, **NODES_ENV)
    admitted = wait_for(lambda: (gang := gang_of(cluster, "refill")) is not None and gang.state in ("admitted", "running")
                        and gang, timeout=60, every=0.05)
    assert follower.name not in admitted.workers.values() and len(admitted.workers) == 3, admitted
    # (the end of the test: an admitted gang's job is running, or about to be once its leader claims it)
    assert job.cancel() in ("requested", "cancelled")
