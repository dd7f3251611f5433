"""The control plane's Redis load with thousands of workers and jobs, on one real Redis.

For each scale N: a fresh redis-server, N job records each claimed by its own simulated worker (the
real claim script), and for ``--seconds`` every simulated worker does what a real worker running a
job does to Redis, at its real cadence and with the real scripts (``leases._RENEW`` with the job's
progress, every ``BATON_HEARTBEAT_S``; ``presence._ANNOUNCE`` every ``presence.ANNOUNCE_EVERY_S``; a
try for the reaper's turn every period; a commit's fence, one GET of the lease, every
``checkpoint.min_interval_s``: about the most a job commits at the default spacing, besides its new
bests). One real ``Reaper`` (the worker code's own thread: the due
index, the sweep, the scheduler's turn) makes every period's pass. Simulated workers train nothing.
Their commands go in pipelines from one process, one round trip per batch, so what is measured is
Redis's work per command, not a connection per worker; their tries for the turn go to a twin key
(the same command on the same kind of key), so that the real reaper holds every pass. On a machine
of few cores the simulation may not keep its cadence at 10,000 workers: the table says how many
renewals a second it did send (one per worker a second is the full rate).

During the window:
- a second in, a priority-10 job is submitted with every worker busy: the decision time is from its
  submit to the turn that asks a running job to yield;
- then ``--kills`` simulated workers stop renewing at random moments: each lease-loss detection time
  is from the worker's last renewal to the reaper's requeue (``TTL`` + up to a period is the design).

Measured from Redis itself (``INFO commandstats``, ``INFO cpu``) over the window: commands per second
(every command, those that scripts make included, as Redis counts them; and the script calls alone), the Redis server's CPU (user +
system, as a fraction of one core), and from the reaper: its pass time and the scheduler's turn time.

    python bench/control_plane.py [--workers 1000,10000] [--seconds 30] [--kills 40]
    python bench/control_plane.py --workers 200 --seconds 8 --kills 5 --out /tmp/cp.json   # a quick look
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Optional

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baton.jobs.services import RedisServer  # noqa: E402
from baton.schemas.hosting import WorkerOffer  # noqa: E402
from baton.schemas.settings import BatonSettings  # noqa: E402
from baton.schemas.spec import CheckpointSpec  # noqa: E402
from baton.storage.records import keys, leases, presence, reaping  # noqa: E402
from baton.storage.records.job_records import JobRecords  # noqa: E402
from baton.workers.queue.reaper import Reaper  # noqa: E402

_DEFAULTS = BatonSettings.model_fields
TTL_S, HEARTBEAT_S, PERIOD_S = (float(_DEFAULTS[name].default) for name in ("lease_ttl_s", "heartbeat_s", "reaper_period_s"))
"""The workers' defaults (BATON_LEASE_TTL_S, BATON_HEARTBEAT_S, BATON_REAPER_PERIOD_S)."""
COMMIT_EVERY_S = float(CheckpointSpec.model_fields["min_interval_s"].default)
"""A job commits about this often at most at the default spacing, besides its new bests (each commit's fence is
one GET)."""
QUEUE = "gpu"
OFFER = WorkerOffer(run="sim", modules=("builtin",)).model_dump_json()
"""What each simulated worker announces it offers (as a real one does with its queues)."""
BATCH = 500  # commands per pipeline


def job_fields(n: int) -> dict[str, str]:
    return {"name": f"sim-{n}", "spec": "{}", "queue": QUEUE, "team": f"team{n % 4}", "priority": "0",
            "max_attempts": "3"}


def setup(client: redis.Redis, records: JobRecords, n: int) -> list[tuple[str, str, str]]:
    """N jobs, each claimed by its own worker: (job id, worker, lease token)."""
    held = []
    for i in range(n):
        job_id, worker = f"j{i}", f"w{i}@sim"
        records.create(job_id, job_fields(i))
        records.published(job_id, records.pending_mark(job_id))
        claim = leases.claim(client, job_id, 1, worker, 600)  # (the simulation's first renewal sets the TTL)
        assert claim.ok, claim.reason
        held.append((job_id, worker, claim.token))
    return held


TICK_S = 0.05


class Simulation:
    """The simulated workers, in a process of their own (the real reaper's process must not wait on
    their interpreter lock): each action of each worker is due at its own phase, in ticks of ``TICK_S``.
    ``kills``: (seconds after ``t0``, job id) at which that job's worker stops renewing."""

    def __init__(self, url: str, held: list[tuple[str, str, str]], period_s: float, kills: list[tuple[float, str]]):
        self.url, self.held, self.period_s, self.kills = url, held, period_s, sorted(kills)

    def start(self, t0: float, seconds: float) -> "multiprocessing.Process":
        """Run until ``t0 + seconds`` (wall clock); ``self.results`` gets {stopped, behind_s} at the end."""
        context = multiprocessing.get_context("fork")
        self.results = context.Queue()
        process = context.Process(target=self._run, args=(t0, seconds), daemon=True)
        process.start()
        return process

    def _run(self, t0: float, seconds: float) -> None:
        client = redis.Redis.from_url(self.url, decode_responses=True)
        renew, announce = client.register_script(leases._RENEW), client.register_script(presence._ANNOUNCE)
        every = {"renew": HEARTBEAT_S, "announce": presence.announce_every_s(self.period_s), "turn": self.period_s,
                 "fence": COMMIT_EVERY_S}
        holds = max(presence.LAPSES_AFTER_ANNOUNCES * every["announce"], presence.LAPSES_AFTER_MIN_S)
        rng = random.Random(0)
        buckets = {}
        for kind, interval in every.items():
            slots = max(1, round(interval / TICK_S))
            buckets[kind] = [[] for _ in range(slots)]
            for i in range(len(self.held)):
                buckets[kind][int(rng.random() * slots)].append(i)
        stopped: dict[str, float] = {}
        last: dict[str, float] = {}
        kills, behind, tick, step = list(self.kills), 0.0, 0, 0
        while time.time() < t0 + seconds:
            due_at = time.time()
            while kills and kills[0][0] + t0 <= due_at:
                job_id = kills.pop(0)[1]
                stopped[job_id] = last.get(job_id, due_at)
            pipe = client.pipeline(transaction=False)
            for kind, slots in buckets.items():
                for i in slots[tick % len(slots)]:
                    job_id, worker, token = self.held[i]
                    if kind == "renew" and job_id not in stopped:
                        step += 1
                        renew(keys=[keys.lease(job_id), keys.job(job_id), keys.worker_stopping(worker),
                                    keys.worker_drained(worker)],
                              args=[token, int(TTL_S * 1000), job_id, "step", step, "loss", 0.5, "updated_at", due_at],
                              client=pipe)
                        last[job_id] = due_at
                    elif kind == "fence" and job_id not in stopped:  # (WorkerControl.fence: records.holds)
                        pipe.get(keys.lease(job_id))
                    elif kind == "announce" and job_id not in stopped:
                        announce(keys=[keys.QUEUES], args=[worker, holds, OFFER, QUEUE], client=pipe)
                    elif kind == "turn":  # (a try for the free turn: what every reaper but the holder sends)
                        pipe.set(keys.REAPER_TURN + ":sim", worker, nx=True,
                                 px=int(self.period_s * 1000 * reaping.TURN_HELD_PERIODS))
                    if len(pipe) >= BATCH:
                        pipe.execute()
            pipe.execute()
            tick += 1
            behind = max(behind, time.time() - due_at - TICK_S)
            time.sleep(max(0.0, due_at + TICK_S - time.time()))
        self.results.put({"stopped": stopped, "behind_s": behind})


def redis_counters(client: redis.Redis) -> tuple[dict[str, int], float]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = {name[len("cmdstat_"):]: int(v["calls"]) for name, v in stats.items()}
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


class TimedReaper(Reaper):
    """The worker's own reaper, its passes and scheduler turns timed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes: list[float] = []
        self.turns: list[float] = []
        turn = self._scheduler.turn

        def timed_turn():
            began = time.perf_counter()
            try:
                return turn()
            finally:
                self.turns.append(time.perf_counter() - began)
        self._scheduler.turn = timed_turn  # type: ignore[method-assign]

    def make_pass(self) -> None:
        began = time.perf_counter()
        super().make_pass()
        self.passes.append(time.perf_counter() - began)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Events:
    """What the real reaper did, as it did it (wall clock): requeues, and the first yield decided."""

    def __init__(self):
        self.detected: dict[str, float] = {}
        self.requeued: list[str] = []
        self.submitted_at: Optional[float] = None
        self.decided_s: Optional[float] = None

    def on_action(self, job_id: str, action: str) -> None:
        if action == "requeue":
            self.requeued.append(job_id)
            self.detected.setdefault(job_id, time.time())

    def on_turn(self, counts, yields) -> None:
        if yields and self.submitted_at is not None and self.decided_s is None:
            self.decided_s = time.time() - self.submitted_at

    def submit_urgent(self, records: JobRecords) -> None:
        """A priority-10 job, with every worker busy at priority 0."""
        self.submitted_at = time.time()
        records.create("urgent", {**job_fields(0), "name": "urgent", "priority": "10"})


def kill_plan(jobs: list[str], kills: int, seconds: float) -> list[tuple[float, str]]:
    """``kills`` workers stop renewing at random moments after the urgent job's submit, each early
    enough to be found within the window."""
    rng = random.Random(1)
    return list(zip(sorted(rng.uniform(2.0, seconds - TTL_S - 2 * PERIOD_S - 1) for _ in range(kills)),
                    rng.sample(jobs, kills)))


def measure(n: int, seconds: float, kills: int) -> dict:
    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        records = JobRecords(client)
        began = time.monotonic()
        held = setup(client, records, n)
        setup_s = time.monotonic() - began
        sim = Simulation(server.url, held, PERIOD_S, kill_plan([job_id for job_id, _, _ in held], kills, seconds))
        events = Events()
        reaper = TimedReaper(redis.Redis.from_url(server.url, decode_responses=True), lambda job, attempt, queue: None,
                             PERIOD_S, "reaper@sim", on_action=events.on_action, lease_ttl_s=TTL_S, on_turn=events.on_turn)
        t0 = time.time() + 2  # every simulated worker has announced and renewed once by then
        process = sim.start(t0, seconds)
        reaper.start()
        time.sleep(max(0.0, t0 - time.time()))
        calls0, cpu0 = redis_counters(client)
        time.sleep(1.0)
        events.submit_urgent(records)
        time.sleep(max(0.0, t0 + seconds - time.time()))
        calls1, cpu1 = redis_counters(client)
        window = time.time() - t0
        outcome = sim.results.get(timeout=60)
        process.join(timeout=10)
        reaper.stop()
        return {"workers": n, "jobs": n, "window_s": window, "setup_s": setup_s,
                **rates(calls0, calls1, cpu1 - cpu0, window), **figures(reaper, outcome, events)}
    finally:
        server.stop()


def rates(calls0: dict[str, int], calls1: dict[str, int], cpu_s: float, window: float) -> dict:
    per_s = {name: (calls1.get(name, 0) - calls0.get(name, 0)) / window for name in calls1}
    return {"commands_per_s_all": sum(per_s.values()),
            "scripts_per_s": per_s.get("evalsha", 0.0) + per_s.get("eval", 0.0),
            "by_command_per_s": dict(sorted(((k, round(v, 1)) for k, v in per_s.items() if v >= 0.5),
                                            key=lambda kv: -kv[1])),
            "redis_cpu_core_fraction": cpu_s / window,
            "renewals_per_s": per_s.get("pexpire", 0.0)}  # (each renewal makes one PEXPIRE; nothing else does here)


def figures(reaper: TimedReaper, outcome: dict, events: Events) -> dict:
    stopped = outcome["stopped"]
    detection = [events.detected[j] - stopped[j] for j in stopped if j in events.detected]
    return {
        "reaper_pass_s": {"median": pct(reaper.passes, 0.5), "p99": pct(reaper.passes, 0.99),
                          "max": pct(reaper.passes, 1.0), "passes": len(reaper.passes)},
        "scheduler_turn_s": {"median": pct(reaper.turns, 0.5), "p99": pct(reaper.turns, 0.99),
                             "max": pct(reaper.turns, 1.0)},
        "lease_loss_detection_s": {"p50": pct(detection, 0.5), "p99": pct(detection, 0.99),
                                   "max": max(detection) if detection else None,
                                   "detected": len(detection), "killed": len(stopped)},
        "preemption_decided_s": events.decided_s,
        "requeued": len(events.requeued),
        "simulation_behind_s": outcome["behind_s"],
    }


def print_table(rows: list[dict]) -> None:
    print(f"\ncontrol plane on one Redis ({os.cpu_count()} cores; lease TTL {TTL_S:.0f} s, heartbeat {HEARTBEAT_S} s, "
          f"reaper period {PERIOD_S} s)")
    print(f"{'workers=jobs':>12} {'renewals/s':>10} {'cmds/s':>9} {'per worker':>10} {'Redis CPU':>9} "
          f"{'pass p50/p99 ms':>16} {'turn p99 ms':>11} {'detect p50/p99 s':>16} {'preempt s':>9}")
    for r in rows:
        d = r["lease_loss_detection_s"]
        print(f"{r['workers']:>12} {r['renewals_per_s']:>10.0f} {r['commands_per_s_all']:>9.0f} "
              f"{r['commands_per_s_all'] / r['workers']:>10.2f} "
              f"{r['redis_cpu_core_fraction'] * 100:>8.1f}% "
              f"{r['reaper_pass_s']['median'] * 1e3:>7.1f}/{r['reaper_pass_s']['p99'] * 1e3:<8.1f} "
              f"{r['scheduler_turn_s']['p99'] * 1e3:>11.1f} {d['p50']:>7.2f}/{d['p99']:<8.2f} "
              f"{r['preemption_decided_s'] if r['preemption_decided_s'] is not None else float('nan'):>9.2f}")
    for r in rows:
        top = ", ".join(f"{k} {v:.0f}" for k, v in list(r["by_command_per_s"].items())[:8])
        print(f"  {r['workers']}: {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1000,10000", help="scales, comma-separated (workers = running jobs)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--kills", type=int, default=40, help="simulated workers that stop renewing during the window")
    parser.add_argument("--out", default="bench/results/control_plane.json")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.workers.split(",")):
        row = measure(n, args.seconds, min(args.kills, n // 2))
        rows.append(row)
        print(f"  {n} workers: {row['commands_per_s_all']:.0f} commands/s, Redis CPU "
              f"{row['redis_cpu_core_fraction'] * 100:.1f}%", flush=True)
    print_table(rows)
    out = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load_avg_1m": os.getloadavg()[0]},
                               "seconds": args.seconds, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
