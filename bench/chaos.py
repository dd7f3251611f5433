"""Chaos: one job on a pool of `baton worker` processes, through N faults in a seeded random order.

Real redis-server (append-only file, fsync always), moto's S3 server behind a TCP proxy that can
cut it off, real `baton worker` processes (replaced when they exit), real signals. Faults:

- sigkill:   SIGKILL the holder's process group (the node is gone)
- sigterm:   SIGTERM the holder (a spot notice)
- sigstop:   SIGSTOP the holder's group until another worker has taken the job over, then SIGCONT
- redis:     SIGKILL redis-server, start it again from its append-only file
- s3:        the S3 endpoint unreachable for OUTAGE_S (every connection reset)
- corrupt:   freeze the holder, overwrite the latest checkpoint's bytes, SIGKILL it (so a resume must read them)
- duplicate: publish the running attempt's message again
- fullspool: the holder's checkpoint writer may write no file past 1 KiB (RLIMIT_FSIZE, set on the
             running process as a disk filling up would): its next checkpoint cannot be spooled
- corruptbest: freeze the holder, overwrite the best checkpoint's bytes, let it go on (its finalize
             must fall back, not fail the job)
- duprun:    `baton run` of the job, on the same store, while a worker holds it (it must refuse)
- shmsweep:  baton's /dev/shm sweeps run in a pid namespace of their own (another container sharing
             the machine's /dev/shm): they must take nothing of the holder's (the attempt goes on)
- writerkill: SIGKILL the holder's checkpoint writer process at every checkpoint (as the OOM killer
             would), until the attempt is given up as a loss and taken over
- finalize:  SIGKILL redis-server as training ends, start it again OUTAGE_S later (always the last)

Beside the job, from the start, a second one: two data-parallel ranks whose data set raises on rank
1 (tests.probes:failing_on_rank), with retry.max_attempts 3. It must fail once, with rank 1's
exception and traceback in its status, and not be retried. And a third (``--gang``, the default;
``bench/chaos_gang.py``): a two-node job whose gang meets a Redis restart the moment it is admitted
and whose every rendezvous meets a stranger: it must end bit-exact, the stranger never in.

After each fault it waits until the job trains past the step it had reached. Through the faults
that run a process of their own (duprun, shmsweep) the job's data loading is held still, so a loaded
machine cannot let the job train to its end before every fault is in. At the end: the
final state compared bit for bit (torch.equal on every tensor, equal losses) with an
uninterrupted `baton run` of the same spec. Watched throughout (manifest.json, polled):
committed checkpoints that vanished while newer than the job's latest (not ones the harness
corrupted), and entries committed by an attempt already fenced out (older than the manifest's
attempt at the previous poll).

    python bench/chaos.py --faults 20 [--seed 0] [--workers 4] [--kinds sigkill,redis] [--no-gang] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import redis as redis_lib  # noqa: E402

from baton.jobs.client import JobClient  # noqa: E402
from baton.jobs.services import RedisServer, S3Server, WorkerProcess, stop_workers  # noqa: E402
from baton.storage.stores.file_store import FileStore  # noqa: E402
from baton.storage.stores.open import open_store  # noqa: E402

from tests.helpers import assert_same_training, make_spec, read_manifest, run_baton, write_spec  # noqa: E402
from tests.netfault import FaultyProxy  # noqa: E402

from bench.chaos_faults import JOB, KINDS, inject, wait_until  # noqa: E402
from bench.chaos_gang import GANG_JOB, NODES_ENV, GangSide  # noqa: E402
from tests.workers.parallel.test_fsdp import FSDP  # noqa: E402

RECOVERY_TIMEOUT_S = 180.0
"""A fault the job has not trained past in this long is counted as not survived."""
BUCKET = "chaos"
RANK_JOB = "chaos-rank-failure"
RANK_FAILURE = make_spec(data={"target": "tests.probes:failing_on_rank", "kwargs": {"n_per_class": 300, "rank": 1,
                                                                                  "after": 40}},
                         loop={"epochs": 1}, checkpoint={"every_steps": 2, "min_interval_s": 0}, resources={"processes": 2},
                         retry={"max_attempts": 3})


HELD = ("duprun", "shmsweep")
"""Faults the job is held still through (its data loading waits): each runs a process of its own,
tens of seconds on a loaded machine, and training on through them would leave steps for none after."""
HOLD_AT_MOST_S = 120.0


def chaos_spec(faults: int, hold: Path) -> dict:
    """~0.1 s per optimizer step (slow data, as real data is), long enough for every fault; loading
    waits while the file ``hold`` exists."""
    steps_per_epoch = 23  # 720 training samples in batches of 32
    epochs = max(2, math.ceil((faults * 20 + 30) / steps_per_epoch))
    return make_spec(data={"target": "tests.probes:slow_spiral",
                           "kwargs": {"n_per_class": 300, "delay_s": 0.003, "hold": str(hold)}},
                     loop={"epochs": epochs}, checkpoint={"every_steps": 4, "keep_last": 3, "min_interval_s": 0},
                     retry={"max_attempts": 100})  # the job is meant to lose its worker many times


@dataclass
class Fault:
    kind: str
    attempt_before: int
    step_at: int
    injected_at: float
    survived: bool = False
    recovered_s: Optional[float] = None
    attempt_after: Optional[int] = None
    steps_lost: int = 0
    note: str = ""


@dataclass
class Watch:
    """What the manifest poller saw."""

    polls: int = 0
    lost: list = field(default_factory=list)  # committed checkpoints that vanished while newer than the latest
    fenced_commits: list = field(default_factory=list)  # entries by an attempt already fenced out
    corrupted: set = field(default_factory=set)  # keys the harness overwrote (their loss is expected)


class Harness:
    def __init__(self, workdir: Path, n_workers: int, say: Callable[[str], None], extra_env: Optional[dict] = None):
        self.workdir, self.n_workers, self.say = workdir, n_workers, say
        self.redis = RedisServer(persistent=True).start()
        self.s3 = S3Server().start()
        self.s3.create_bucket(BUCKET)
        self.proxy = FaultyProxy(self.s3.port)
        self.storage_url = f"s3://{BUCKET}/runs"
        os.environ.update(self.s3.env())  # the harness reads S3 directly, never through the proxy
        os.environ["BATON_ALLOWED_MODULES"] = "tests"  # the job's data set is tests.probes:slow_spiral
        self.env = {**os.environ, "BATON_REDIS_URL": self.redis.url, "BATON_STORAGE_URL": self.storage_url,
                    "AWS_ENDPOINT_URL": self.proxy.endpoint_url, "BATON_ALLOWED_MODULES": "tests",
                    "BATON_METRICS_PORT": "0", "PYTHONPATH": str(REPO), **(extra_env or {})}
        self.workers: list[WorkerProcess] = []
        self.replaced = 0
        self._started = 0
        self._lock = threading.Lock()
        self.client = JobClient(redis_url=self.redis.url, storage_url=self.storage_url)
        self.store = open_store(self.storage_url)
        self.watch = Watch()
        self.duprun_codes: list[int] = []
        self._stop = threading.Event()

    # --- the pool --------------------------------------------------------------------------
    def _new_worker(self) -> WorkerProcess:
        name = f"c{self._started}@chaos"
        self._started += 1
        worker = WorkerProcess(name, self.env, str(self.workdir / f"{name.split('@')[0]}.log")).start()
        self.workers.append(worker)
        return worker

    def start_pool(self) -> None:
        for worker in [self._new_worker() for _ in range(self.n_workers)]:
            worker.wait_ready()

    def replace_exited(self) -> None:
        with self._lock:
            for worker in [w for w in self.workers if w.proc.poll() is not None]:
                self.workers.remove(worker)
                self._new_worker()
                self.replaced += 1

    def holder(self, name: Optional[str]) -> Optional[WorkerProcess]:
        return next((w for w in list(self.workers) if w.name == name and w.proc.poll() is None), None)

    # --- watching --------------------------------------------------------------------------
    def _poll_manifest(self, seen: dict, previous_attempt: list) -> None:
        manifest = read_manifest(self.store, JOB)
        if manifest is None:
            return
        self.watch.polls += 1
        current = {e["key"]: e for e in manifest["checkpoints"]}
        latest = max((e["step"] for e in current.values()), default=-1)
        for key, entry in seen.items():
            if key not in current and entry["step"] > latest and key not in self.watch.corrupted and \
                    key not in {x["key"] for x in self.watch.lost}:
                self.watch.lost.append(entry)
        for key, entry in current.items():
            if key not in seen and entry["attempt"] < previous_attempt[0]:
                self.watch.fenced_commits.append(entry)
            seen[key] = entry
        previous_attempt[0] = manifest["attempt"]

    def _watch(self) -> None:
        seen: dict = {}
        previous_attempt = [0]
        while not self._stop.wait(0.05):
            try:
                self._poll_manifest(seen, previous_attempt)
                self.replace_exited()
            except (OSError, ValueError) as exc:  # a half-read manifest or a dying worker: the next poll sees it
                self.say(f"  (watcher: {type(exc).__name__}: {exc})")

    def start_watching(self) -> None:
        threading.Thread(target=self._watch, name="chaos-watch", daemon=True).start()

    def status(self, job_id: str = JOB):
        """The job's status, waiting out a Redis that is down."""
        while True:
            try:
                return self.client.job(job_id).status()
            except redis_lib.RedisError:
                time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        stop_workers(self.workers)
        self.proxy.close()
        self.s3.stop()
        self.redis.stop()


# --- faults ---------------------------------------------------------------------------------
def run_fault(h: Harness, kind: str, gap_steps: int, after_step: int) -> Optional[Fault]:
    """Wait until the job trains ``gap_steps`` past ``after_step`` (for ``finalize``, until its last
    steps), inject ``kind``, wait for recovery (for ``finalize``, the job's end)."""
    if kind == "finalize":
        status = wait_until(lambda: (s := h.status()).state.terminal and s or
                       (s.state.value == "running" and s.total_steps and (s.step or 0) >= s.total_steps - 3 and s),
                       600, 0.02)
        if status is None or status.state.terminal:
            return None
        fault = Fault(kind, status.attempt, status.step or 0, time.monotonic())
        fault.note = inject(h, kind, status)
        final = wait_until(lambda: (s := h.status()).state.terminal and s, RECOVERY_TIMEOUT_S, 0.1)
        fault.survived = final is not None and final.state.value == "succeeded"
        fault.recovered_s = time.monotonic() - fault.injected_at if final else None
        fault.attempt_after = final.attempt if final else None
        return fault
    status = wait_until(lambda: (s := h.status()).state.terminal and s or
                   (s.state.value == "running" and (s.step or 0) >= after_step + gap_steps and s), 300)
    if status is None or status.state.terminal:
        return None
    committed = read_manifest(h.store, JOB)
    step_at = max(status.step or 0, committed["checkpoints"][-1]["step"] if committed and committed["checkpoints"] else 0)
    fault = Fault(kind, status.attempt, step_at, time.monotonic())
    with held(h.workdir / "hold", kind in HELD):
        fault.note = inject(h, kind, status)
    first_seen: dict[int, Optional[int]] = {}

    def recovered_now():
        s = h.status()
        if s.state.terminal:
            return s
        if s.state.value != "running":
            return None
        # a new attempt's record holds the old attempt's step until its own first progress write
        if s.attempt != status.attempt and first_seen.setdefault(s.attempt, s.step) == s.step:
            return None
        return s if (s.step or 0) > step_at else None

    recovered = wait_until(recovered_now, RECOVERY_TIMEOUT_S, 0.1)
    if recovered is not None:
        fault.survived = recovered.state.value in ("running", "succeeded")
        fault.recovered_s = time.monotonic() - fault.injected_at
        fault.attempt_after = recovered.attempt
        if recovered.attempt != status.attempt and recovered.resumed_from is not None:
            fault.steps_lost = max(0, step_at - recovered.resumed_from)
        elif recovered.attempt != status.attempt:
            fault.steps_lost = step_at
    if kind == "duplicate" and fault.attempt_after is not None and fault.attempt_after != fault.attempt_before:
        fault.survived, fault.note = False, "a duplicate message started a new attempt"
    if kind == "shmsweep" and fault.attempt_after is not None and fault.attempt_after != fault.attempt_before:
        fault.survived, fault.note = False, f"a sweep from another pid namespace cost an attempt ({fault.note})"
    if kind == "writerkill" and "given up as a loss" not in fault.note:
        fault.survived = False
    if kind == "duprun" and not (h.duprun_codes and h.duprun_codes[-1] == 4 and fault.attempt_after == fault.attempt_before):
        fault.survived = False  # it must refuse (exit 4), leaving the worker's attempt alone
    return fault


@contextmanager
def held(hold: Path, hold_still: bool):
    """The job's data loading waits while this is open (``hold_still``), at most HOLD_AT_MOST_S."""
    if not hold_still:
        yield
        return
    hold.touch()
    timer = threading.Timer(HOLD_AT_MOST_S, hold.unlink, kwargs={"missing_ok": True})
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        hold.unlink(missing_ok=True)


def plan(faults: int, seed: int, kinds: tuple[str, ...]) -> list[tuple[str, int]]:
    """``faults`` (kind, gap in steps): every kind once per round, each round shuffled by ``seed``."""
    rng = random.Random(seed)
    order: list[str] = []
    rounds = [k for k in kinds if k != "finalize"] or list(kinds)
    last = ["finalize"] if "finalize" in kinds else []
    while len(order) < faults - len(last):
        round_ = list(rounds)
        rng.shuffle(round_)
        order += round_
    return [(kind, rng.randint(3, 8)) for kind in order[:faults - len(last)] + last]


# --- the run --------------------------------------------------------------------------------
def reference_run(spec_path: Path, root: Path, job_id: str = "reference") -> tuple[FileStore, float]:
    started = time.monotonic()
    done = run_baton("run", str(spec_path), "--id", job_id, "--storage", f"file://{root}")
    if done.returncode != 0:
        raise RuntimeError(f"the reference `baton run` failed:\n{done.stdout}{done.stderr}")
    return FileStore(root), time.monotonic() - started


def run_chaos(faults: int, seed: int, n_workers: int, kinds: tuple[str, ...], say: Callable[[str], None],
              gang: bool = True) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="baton-chaos-"))
    spec = chaos_spec(faults, workdir / "hold")
    spec_path = write_spec(workdir, spec)
    reference, reference_s = reference_run(spec_path, workdir / "reference")
    say(f"reference `baton run`: {reference_s:.1f} s; logs in {workdir}")
    gang_reference = None
    if gang:  # the same two ranks on one node
        gang_reference, _ = reference_run(write_spec(workdir, FSDP, "gang.yaml"), workdir / "gang-reference",
                                          "gang-reference")
    h = Harness(workdir, n_workers, say, NODES_ENV if gang else None)
    side = GangSide(h, REPO) if gang else None
    try:
        h.start_pool()
        h.start_watching()
        started = time.monotonic()
        h.client.submit(spec, JOB)
        h.client.submit(RANK_FAILURE, RANK_JOB)
        if side is not None:
            side.start()
            say(f"  beside it, {GANG_JOB}: Redis restarted as its gang was admitted: {side.redis_restarted}")
        done: list[Fault] = []
        after = 0
        for kind, gap in plan(faults, seed, kinds):
            fault = run_fault(h, kind, gap, after)
            if fault is None:
                say("the job finished before every fault was injected")
                break
            done.append(fault)
            after = fault.step_at
            say(f"  {len(done):>2} {kind:<9} at step {fault.step_at:>4} attempt {fault.attempt_before}->"
                f"{fault.attempt_after}: {'survived' if fault.survived else 'NOT SURVIVED'}"
                f"{f' in {fault.recovered_s:.1f} s' if fault.recovered_s else ''}, {fault.steps_lost} steps lost"
                f"{f' ({fault.note})' if fault.note else ''}")
        final = wait_until(lambda: (s := h.status()).state.terminal and s, 600, 0.2)
        rank_job = wait_until(lambda: (s := h.client.job(RANK_JOB).status()).state.terminal and s, 120, 0.2)
        rank_failure = {
            "state": rank_job.state.value if rank_job else "timeout", "attempt": rank_job and rank_job.attempt,
            "lost": rank_job and rank_job.lost, "error": rank_job and rank_job.error,
            "rank_1_traceback": bool(rank_job and rank_job.traceback and "tests/probes.py" in rank_job.traceback
                                     and "is unreadable on rank 1" in rank_job.traceback),
        }
        # failed, not retried as a loss (a Redis outage longer than the lease may re-queue it uncounted first)
        rank_failure["as_expected"] = (rank_failure["state"], rank_failure["lost"]) == ("failed", 0) and \
            rank_failure["rank_1_traceback"]
        say(f"  beside it, {RANK_JOB}: {rank_failure['state']} at attempt {rank_failure['attempt']}, lost "
            f"{rank_failure['lost']}: {rank_failure['error']}")
        gang_result = None
        if side is not None:
            gang_final = wait_until(lambda: (s := h.status(GANG_JOB)).state.terminal and s, 600, 0.2)
            gang_result = side.result(gang_reference, gang_final)
            say(f"  beside it, {GANG_JOB}: {gang_result['state']} at attempt {gang_result['attempts']}, bit-exact "
                f"{gang_result['bit_exact']}; strangers: {gang_result['strangers']}")
        wall_s = time.monotonic() - started
        time.sleep(0.3)  # one more manifest poll after the end
        try:
            assert final is not None and final.state.value == "succeeded", final and final.error
            assert_same_training(reference, "reference", h.store, JOB)
            bit_exact, difference = True, None
        except AssertionError as exc:
            bit_exact, difference = False, str(exc)
        return {
            "faults_planned": faults, "seed": seed, "workers": n_workers, "kinds": list(kinds),
            "faults_injected": len(done), "faults_survived": sum(f.survived for f in done),
            "final_state": final.state.value if final else "timeout", "attempts": final.attempt if final else None,
            "lost_leases": final.lost if final else None, "workers_replaced": h.replaced,
            "steps_lost": sum(f.steps_lost for f in done), "total_steps": final.total_steps if final else None,
            "wall_s": wall_s, "reference_s": reference_s, "bit_exact": bit_exact, "difference": difference,
            "committed_checkpoints_lost": len(h.watch.lost), "commits_by_fenced_attempts": len(h.watch.fenced_commits),
            "lost_entries": h.watch.lost, "fenced_entries": h.watch.fenced_commits, "manifest_polls": h.watch.polls,
            "faults": [asdict(f) for f in done], "rank_failure": rank_failure, "gang": gang_result,
        }
    finally:
        h.close()


def table(result: dict) -> str:
    by_kind: dict[str, list[dict]] = {}
    for fault in result["faults"]:
        by_kind.setdefault(fault["kind"], []).append(fault)
    rows = ["| fault | injected | survived | recovery (s) | steps lost |", "|---|---|---|---|---|"]
    for kind in KINDS:
        faults = by_kind.get(kind, [])
        if faults:
            times = [f["recovered_s"] for f in faults if f["recovered_s"] is not None]
            span = f"{min(times):.1f}-{max(times):.1f}" if times else "-"
            rows.append(f"| {kind} | {len(faults)} | {sum(f['survived'] for f in faults)} | {span} | "
                        f"{sum(f['steps_lost'] for f in faults)} |")
    summary = [
        "", "| faults injected / survived | attempts | steps lost (of total) | wall time / `baton run` | bit-exact "
        "| committed checkpoints lost | commits by fenced attempts |", "|---|---|---|---|---|---|---|",
        f"| {result['faults_injected']} / {result['faults_survived']} | {result['attempts']} | {result['steps_lost']} "
        f"(of {result['total_steps']}) | {result['wall_s']:.1f} s / {result['reference_s']:.1f} s "
        f"({result['wall_s'] / result['reference_s']:.1f}x) | {'yes' if result['bit_exact'] else 'NO'} | "
        f"{result['committed_checkpoints_lost']} | {result['commits_by_fenced_attempts']} |",
    ]
    rank = result["rank_failure"]
    summary += ["", "| beside it: a rank whose code raises | state | attempts | lost | rank 1's traceback in the status |",
                "|---|---|---|---|---|",
                f"| 2 ranks, `ValueError` on rank 1 | {rank['state']} | {rank['attempt']} | {rank['lost']} | "
                f"{'yes' if rank['rank_1_traceback'] else 'NO'} |"]
    gang = result.get("gang")
    if gang:
        summary += ["", "| beside it: a two-node job | state | attempts | lost | Redis restarted at admission | "
                    "strangers at its rendezvous | a stranger got in | bit-exact |", "|---|---|---|---|---|---|---|---|",
                    f"| 2 nodes x 1 sharded rank | {gang['state']} | {gang['attempts']} | {gang['lost']} | "
                    f"{'yes' if gang['redis_restarted_at_admission'] else 'no'} | {len(gang['strangers'])} | "
                    f"{'YES' if gang['stranger_got_in'] else 'no'} | {'yes' if gang['bit_exact'] else 'NO'} |"]
    return "\n".join(rows + summary)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--gang", action=argparse.BooleanOptionalAction, default=True,
                        help="run the two-node job beside it (a Redis restart at its admission, a stranger at its "
                             "rendezvous)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--out", default=None, help="JSON file (default: bench/results/chaos-<faults>-<seed>.json)")
    args = parser.parse_args()
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; choose from {list(KINDS)}")
    result = run_chaos(args.faults, args.seed, args.workers, kinds, lambda line: print(line, flush=True), args.gang)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    out = Path(args.out or REPO / "bench" / "results" / f"chaos-{args.faults}-{args.seed}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(f"written to {out}")
    ok = result["bit_exact"] and result["faults_survived"] == result["faults_injected"] and \
        not result["committed_checkpoints_lost"] and not result["commits_by_fenced_attempts"] and \
        result["rank_failure"]["as_expected"] and (result["gang"] is None or result["gang"]["as_expected"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
