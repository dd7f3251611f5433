"""Who may join a data-parallel attempt's process group: only the ranks its rank 0 started. Another
process of the node (another user's) must neither join as a rank nor get rank 0 to unpickle what it
sends (torch's object collectives unpickle what the peers send: code of the sender's choosing).
The intruder is ``tests/intruder.py``; every group here is a real gloo group of real processes."""
from __future__ import annotations

import pytest

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional

from baton.storage.stores.file_store import FileStore

from tests.helpers import REPO, baton_env, make_spec, start_baton, write_spec
from tests.intruder import listening_ports
from tests.workers.queue.test_worker_loss import wait_for

SPEC = make_spec(data={"kwargs": {"n_per_class": 200}, "batch_size": 16}, loop={"epochs": 1},
                 checkpoint={"every_steps": 2}, resources={"processes": 2})


@pytest.mark.slow
def test_a_foreign_process_cannot_join_the_group_nor_have_rank_0_unpickle_what_it_sends(tmp_path):
    """The real rank 1 is held (SIGSTOP) as soon as it starts, so that the intruder comes first; it
    tries every port rank 0 listens on. Then rank 1 goes on and the job must end as if no one came."""
    marker = tmp_path / "rank-0-ran-the-intruders-code"
    store = FileStore(tmp_path / "store")
    log = tmp_path / "run.log"
    proc = start_baton("run", str(write_spec(tmp_path, SPEC)), "--id", "guarded", "--storage", store.url, log=log)
    started = [proc]
    rank1 = None
    try:
        rank1 = wait_for(lambda: (m := re.search(r"ranks 1\.\.1 are pids (\d+)", log.read_text())) and int(m[1]),
                         timeout=60, every=0.005)
        os.kill(rank1, signal.SIGSTOP)
        ports = listening_ports(proc.pid)
        intruder = subprocess.Popen([sys.executable, "-m", "tests.intruder", "ports", str(marker), *map(str, ports)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    cwd=REPO, env=baton_env())
        started.append(intruder)
        out, err = intruder.communicate(json.dumps({"spec": SPEC, "job_id": "guarded"}), timeout=240)
        tried = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        assert not marker.exists(), f"rank 0 unpickled the intruder's bytes; on ports {ports}: {tried}"
        assert not any(outcome.startswith("joined") for outcome in tried.values()), tried
        os.kill(rank1, signal.SIGCONT)
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        if rank1 is not None:
            try:
                os.kill(rank1, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        if rank1 is not None:
            try:
                os.kill(rank1, signal.SIGKILL)
            except ProcessLookupError:
                pass


def intruders(mode: str, *per_rank: list[str]) -> list[str]:
    """Run ``tests.intruder MODE`` as the ranks of one group (``per_rank[r]``: rank r's arguments);
    what each printed."""
    return run_together(*([mode, str(rank), *args] for rank, args in enumerate(per_rank)))


def run_together(*commands: list[str], timeout: float = 120, needed: Optional[list[int]] = None) -> list[str]:
    """``tests.intruder`` processes started together; the last line each printed. With ``needed`` (the
    indexes of the processes whose word the test reads), the others are killed once those have ended
    (a rank left waiting on a connection the stranger broke can wait for gloo's own timeout, 100 s)."""
    procs = [subprocess.Popen([sys.executable, "-m", "tests.intruder", *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, env=baton_env()) for args in commands]
    try:
        if needed is not None:
            for index in needed:
                procs[index].wait(timeout=timeout)
            time.sleep(2)  # the others: a moment to end by themselves
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        outs = [proc.communicate(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [out.strip().splitlines()[-1] if out.strip() else f"(nothing; stderr: {err[-2000:]})" for out, err in outs]


def test_rank_0_does_not_unpickle_what_a_member_of_its_group_sends(tmp_path):
    """Even from a process inside the group (neither side proving anything), rank 0's gather of the
    ranks' checkpoint states loads tensors and plain values only: a pickle that runs code is refused."""
    marker = tmp_path / "rank-0-ran-the-senders-code"
    rank0, rank1 = intruders("send-pickle", [str(tmp_path), str(marker)], [str(tmp_path), str(marker)])
    assert not marker.exists(), (rank0, rank1)
    assert rank1 == "sent" and rank0.startswith("refused: UnpicklingError"), (rank0, rank1)


@pytest.mark.slow
def test_a_rank_that_does_not_prove_the_attempts_secret_is_refused_before_anything_is_exchanged(tmp_path):
    """One that got through the store (as a process that took a rank's place on a listening port
    would) but holds no secret is found by the group's proof."""
    good, bad = "a" * 64, "b" * 64
    for name in ("same", "other"):
        (tmp_path / name).mkdir()
    assert intruders("join", [str(tmp_path / "same"), good], [str(tmp_path / "same"), good]) == ["joined", "joined"]
    rank0, rank1 = intruders("join", [str(tmp_path / "other"), good], [str(tmp_path / "other"), good, bad])
    refused = "RankLost: rank(s) {} of the default process group did not prove this attempt's secret"
    assert rank0.startswith(refused.format(1)) and rank1.startswith(refused.format(0)), (rank0, rank1)


@pytest.mark.slow
def test_a_rank_without_the_secret_cannot_read_the_rendezvous(tmp_path):
    """Its address cannot be opened by the ranks, nor theirs by it: each side ends in a loss."""
    rank0, rank1 = intruders("join", [str(tmp_path), "a" * 64], [str(tmp_path), "b" * 64])
    assert rank0.startswith("RankLost: the rendezvous value '") and "not sealed with this attempt's secret" in rank0, rank0
    assert rank1.startswith("RankLost: the rendezvous value '"), rank1


def stranger_at_the_store(tmp_path, keep_writing_s: float, needed: Optional[list[int]] = None) -> tuple[str, str, str]:
    """Two baton ranks of a sharded group meet at a TCP store (a multi-node attempt's); a stranger who
    knows only the store's address writes its gloo address into rank 1's slot of the checkpoint
    group before the real rank 1 comes. What rank 0, rank 1 and the stranger printed."""
    secret = "c" * 64
    return tuple(run_together(["tcp-rank", "0", str(tmp_path), secret], ["tcp-rank", "1", str(tmp_path), secret],
                              ["steal-slot", str(tmp_path), str(tmp_path / "marker"), str(keep_writing_s)],
                              needed=needed))


@pytest.mark.slow
def test_a_stranger_at_a_multinode_store_cannot_take_a_place_in_the_checkpoint_group(tmp_path):
    """It comes first and the real rank 1 comes after it: the group forms with the real rank 1, and
    nothing the stranger sent is unpickled."""
    rank0, rank1, stranger = stranger_at_the_store(tmp_path, keep_writing_s=0)
    assert not (tmp_path / "marker").exists(), ("rank 0 ran the stranger's code", rank0, rank1, stranger)
    assert rank0 == "gathered ['rank 0', 'rank 1']" and rank1 == "sent", (rank0, rank1, stranger)
    assert not stranger.startswith("joined"), stranger


@pytest.mark.slow
def test_a_stranger_who_keeps_its_address_in_the_store_ends_the_attempt_as_a_loss(tmp_path):
    """It writes its address over the real rank 1's for longer than the rendezvous may take: rank 0
    cannot form the checkpoint group, and says so as a loss (not the job's failure) in time."""
    for tries in range(4):  # rank 0 may read the real rank 1's address in the 5 ms before the stranger's returns:
        where = tmp_path / str(tries)  # the group then forms with the real ranks (safe, but not this case: again)
        where.mkdir()
        rank0, rank1, stranger = stranger_at_the_store(where, keep_writing_s=40, needed=[0, 2])  # (rank 1's: any)
        assert not (where / "marker").exists(), ("rank 0 ran the stranger's code", rank0, rank1, stranger)
        assert not stranger.startswith("joined"), stranger
        if rank0 != "gathered ['rank 0', 'rank 1']":
            break
    assert rank0.startswith("RankLost: ") and "not sealed with this attempt's secret" in rank0, (rank0, rank1, stranger)


@pytest.mark.slow
def test_a_stranger_holding_one_connection_of_three_ranks_is_found_by_the_proof(tmp_path):
    """In a ring all-gather the honest ranks relay each other's proofs, so a stranger holding one
    connection (rank 1 slow, the stranger first at a listening port with the pair's number) never had
    to prove anything. Each connection is proven on its own: the rank at the stranger's end waits for
    a proof that never comes (or refuses a wrong one), and leaves the group as a loss."""
    for tries in range(4):  # which side of a pair listens depends on the ports drawn: until one is taken
        where = tmp_path / str(tries)
        where.mkdir()
        *ranks, stranger = run_together(*(["ring-rank", str(rank), str(where)] for rank in range(3)),
                                        ["hijack", str(where)])
        taken = [victim for victim, _, received in json.loads(stranger) if received]
        if taken:
            break
    assert taken, ("the stranger never took a connection", ranks, stranger)
    for victim in taken:  # the rank at the stranger's end never joins: no proof comes (a loss, in time)
        assert ranks[victim] != "joined", (ranks, stranger)


@pytest.mark.slow
def test_a_stranger_deleting_a_ranks_address_ends_the_attempt_within_the_rendezvous_timeout(tmp_path):
    """gloo waits for an address with the collective timeout (20 s here); the rendezvous gives up at
    its own (3 s): a loss, in time."""
    rank0, rank1, stranger = run_together(["slow-rank", "0", str(tmp_path)], ["slow-rank", "1", str(tmp_path)],
                                          ["delete-slot", str(tmp_path)])
    assert stranger.startswith("deleted rank 1's address") and not stranger.startswith("deleted rank 1's address 0 "), \
        stranger
    outcome, seconds = rank0.rsplit(" after ", 1)
    assert outcome in ("RankLost", "DistStoreError") and float(seconds.rstrip("s")) < 10, (rank0, rank1, stranger)


def test_a_ready_mark_a_stranger_wrote_does_not_count(tmp_path):
    """Rank 0 joins once every rank said it is ready: a mark not sealed with the secret is no rank's."""
    import torch.distributed as dist

    from baton.workers.parallel.rendezvous import open_store

    store = open_store(tmp_path, 2, 5, "c" * 64)
    stranger = dist.FileStore(str(tmp_path / "rendezvous"), 2)
    stranger.set("baton/ready/1", "1")
    assert not store.check(["baton/ready/1"])
    store.set("baton/ready/1", "1")
    assert store.check(["baton/ready/1"])
