"""Where a command's CPU goes, by kind of process: run it (the test suite, a bench) while sampling /proc,
then print a table and write JSON.

    python bench/suite_cpu.py [--every 0.25] [--out FILE] -- scripts/test.sh -m quick

Every process below the command counts, whoever reaps it: a worker's forkserver outlives its worker
and is never waited for, so ``time`` and ``getrusage`` miss it and all the training processes it
forked. A process is the command's if its parent was, when first seen. Each is read every ``--every``
seconds: a process that lives less than that may be missed, and one that ends between two reads loses
its last fraction of a tick, so the totals are a floor (compare them with the machine's, also printed).
Linux only."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.storage.checkpointing.writer_start import WRITER_NAME  # noqa: E402
from baton.workers.parallel.spare_ranks import RANK_NAME  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    pid: int
    ppid: int
    started: int  # clock ticks since boot: a pid and its start name one process
    comm: str
    cmd: str
    cpu_ticks: int = 0
    kind: str = ""
    test: str = ""  # the pytest test that started it (its own PYTEST_CURRENT_TEST, else its parent's)


class Stat(NamedTuple):
    ppid: int
    comm: str
    cpu_ticks: int  # user + system
    started: int
    zombie: bool  # ended, not yet reaped: its ticks are final


def read_stat(pid: str) -> Stat | None:
    """What /proc/PID/stat says, or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return Stat(int(fields[1]), comm, int(fields[11]) + int(fields[12]), int(fields[19]), fields[0] == "Z")


def read_cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:400]
    except OSError:
        return ""


def read_test(pid: str) -> str:
    """The test a process was started by, from the PYTEST_CURRENT_TEST its environment began with."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            block = f.read()
    except OSError:
        return ""
    for entry in block.split(b"\0"):
        if entry.startswith(b"PYTEST_CURRENT_TEST="):
            return entry.split(b"=", 1)[1].decode(errors="replace").rsplit(" (", 1)[0]
    return ""


def machine_ticks() -> tuple[int, int]:
    """(busy, all) ticks of every CPU since boot."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


RULES = [  # (a piece of the command line or name, the kind), the first that matches
    ("baton.jobs.local_s3", "moto (S3)"),
    ("baton.storage.checkpointing.writer_process", "checkpoint writer"), (WRITER_NAME, "checkpoint writer"),
    ("baton.workers.parallel.rank_main", "rank 1..N-1"), ("-m baton worker", "worker main"),
    ("-m baton run", "baton run"), ("-m baton", "baton CLI, other commands"), ("bin/baton ", "baton CLI, other commands"),
    ("pytest", "pytest"), ("exec(eval(sys.stdin.readline()))", "pytest"),  # the second: xdist's workers (execnet)
    ("bench/", "bench scripts"), ("redis-server", "redis-server"), ("moto", "moto (S3)"), ("mlflow", "mlflow"),
    ("chrom", "chromium"), ("mypy", "mypy"),
    ("-m tests.zygote", "baton commands forked by the tests"), ("-m tests.", "tests' helper processes")]


def in_pytest(directory: Path) -> Counter:
    """Each test's CPU inside its pytest process, as the tests' conftest wrote it in ``directory``
    (``BATONTEST_CPU_DIR``)."""
    spent: Counter = Counter()
    for path in directory.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            spent[row["test"]] += row["cpu_s"]
    return spent


def schedule(directory: Path) -> list[dict]:
    """Which pytest process ran each test, from when to when (wall clock), in the order they began."""
    rows = [json.loads(line) | {"pytest_pid": int(path.stem)} for path in directory.glob("*.jsonl")
            for line in path.read_text().splitlines()]
    return sorted((row for row in rows if "began" in row), key=lambda row: row["began"])


UNATTRIBUTED = ("pytest", "baton commands forked by the tests", "redis-server", "moto (S3)", "mlflow")
"""Kinds whose processes serve many tests (a pytest process, its servers): the test in their environment is
only the first one that needed them."""


def kind_of(proc: Seen, parent: Seen | None) -> str:
    cmd, comm = proc.cmd, proc.comm
    if comm == WRITER_NAME:  # forked from a training process: its command line is its parent's
        return "checkpoint writer"
    if comm == RANK_NAME:  # forked ahead of its attempt (so is a data loader worker it forks, by that name too)
        return "data loader worker (forked)" if parent is not None and parent.kind == "rank 1..N-1" else "rank 1..N-1"
    if "forkserver import main" in cmd:
        if parent is not None and parent.kind in ("forkserver", "training process (forked)"):
            return "training process (forked)"
        return "forkserver"
    if parent is not None and parent.kind in ("training process (forked)", "rank 1..N-1") and cmd == parent.cmd:
        return "data loader worker (forked)"
    for needle, kind in RULES:
        if needle in cmd or needle in comm:
            return kind
    return "other" if "python" not in cmd else "other python"


def alive(proc: Seen) -> bool:
    stat = read_stat(str(proc.pid))
    return stat is not None and stat.started == proc.started and not stat.zombie


def classify(seen: Seen, parent: Optional[Seen], pid: str) -> None:
    seen.kind = kind_of(seen, parent)
    if seen.kind not in UNATTRIBUTED:
        seen.test = read_test(pid) or (parent.test if parent is not None else "")


def parent_cmd(seen: Seen, mine: dict[int, Seen]) -> Optional[str]:
    parent = mine.get(seen.ppid)
    return parent.cmd if parent is not None else None


class Sampled(NamedTuple):
    procs: dict[tuple[int, int], Seen]
    returncode: int
    wall_s: float
    machine: tuple[int, int]  # (busy, all) ticks of every CPU over the run
    timeline: list[tuple[float, int, int]]  # (seconds since the start, busy, all ticks) at each read


def sample(command: list[str], every: float, linger: float, env: dict[str, str]) -> Sampled:
    root = subprocess.Popen(command, env=env)
    timeline: list[tuple[float, int, int]] = []
    ours: dict[tuple[int, int], Seen] = {}
    mine: dict[int, Seen] = {}  # live pid -> the process of ours it now names
    busy0, all0 = machine_ticks()
    started = time.monotonic()
    ended = None
    while True:
        if ended is None and root.poll() is not None:
            ended = time.monotonic()
        # after the command, until what it left behind has ended too (or ``linger`` has passed)
        done = ended is not None and (time.monotonic() - ended > linger
                                      or not any(alive(p) for p in mine.values() if p.pid != root.pid))
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            stat = read_stat(pid)
            if stat is None:
                continue
            ppid, comm, cpu, start, _ = stat
            key = (int(pid), start)
            seen = ours.get(key)
            if seen is None:
                parent = mine.get(ppid)
                if int(pid) != root.pid and (parent is None or parent.started > start):
                    stale = mine.get(int(pid))
                    if stale is not None and stale.started != start:
                        del mine[int(pid)]  # that pid is another process's now
                    continue  # not below the command
                seen = ours[key] = mine[int(pid)] = Seen(int(pid), ppid, start, comm, read_cmdline(pid))
                classify(seen, parent, pid)
            elif parent_cmd(seen, mine) == seen.cmd and (cmd := read_cmdline(pid)) != seen.cmd:
                seen.cmd = cmd  # first read between its fork and its exec: what it runs is known only now
                classify(seen, mine.get(ppid), pid)
            seen.cpu_ticks, seen.comm = cpu, comm
        timeline.append((time.monotonic() - started, *machine_ticks()))
        if done:
            break
        time.sleep(every)
    busy1, all1 = machine_ticks()
    return Sampled(ours, root.returncode, time.monotonic() - started, (busy1 - busy0, all1 - all0), timeline)


def busy_by_window(timeline: list[tuple[float, int, int]], window_s: float) -> list[float]:
    """The share of the machine's CPU time that was busy in each ``window_s`` of the run: where the cores
    idled (a tail of one long test file, tests that wait)."""
    shares, start = [], 0
    for i, (t, busy, total) in enumerate(timeline):
        if t - timeline[start][0] >= window_s or i == len(timeline) - 1:
            spent = total - timeline[start][2]
            shares.append((busy - timeline[start][1]) / spent if spent else 0.0)
            start = i
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=float, default=0.25, help="seconds between reads of /proc")
    parser.add_argument("--linger", type=float, default=30.0,
                        help="seconds to go on reading the processes the command left running when it ended")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per row of the cores' busy timeline")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "suite_cpu.json")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    with tempfile.TemporaryDirectory(prefix="baton-suite-cpu-") as tests_cpu:
        run = sample(command, args.every, args.linger, {**os.environ, "BATONTEST_CPU_DIR": tests_cpu})
        procs, returncode, wall, (busy, total) = run.procs, run.returncode, run.wall_s, run.machine
        inside, ran = in_pytest(Path(tests_cpu)), schedule(Path(tests_cpu))
    cpu, count = Counter(), Counter()
    for proc in procs.values():
        cpu[proc.kind] += proc.cpu_ticks / TICKS
        count[proc.kind] += 1
    measured = sum(cpu.values())
    cores = os.cpu_count() or 1
    print(f"\n{'kind of process':32} {'processes':>9} {'CPU s':>8} {'share':>6}")
    for kind, seconds in cpu.most_common():
        print(f"{kind:32} {count[kind]:9d} {seconds:8.1f} {seconds / max(measured, 1e-9):6.1%}")
    by_test = Counter()
    for proc in procs.values():
        if proc.test:
            by_test[proc.test] += proc.cpu_ticks / TICKS
    combined = by_test + inside
    if combined:
        print(f"\nby test: the processes each started (not {', '.join(UNATTRIBUTED)}), {sum(by_test.values()):.0f} "
              f"CPU s in all, and its CPU in its pytest process, {sum(inside.values()):.0f}; the "
              f"{min(len(combined), 25)} costliest")
        print(f"{'started':>8} {'pytest':>8}  test")
        for test, _ in combined.most_common(25):
            print(f"{by_test[test]:8.1f} {inside[test]:8.1f}  {test}")
    machine_s = busy / TICKS
    timeline = busy_by_window(run.timeline, args.window)
    print(f"\nthe cores busy, per {args.window:.0f} s: " + " ".join(f"{share:.0%}" for share in timeline))
    print(f"{'all of the command':32} {sum(count.values()):9d} {measured:8.1f}")
    print(f"wall {wall:.0f} s; the machine's {cores} cores were busy {machine_s:.0f} CPU s "
          f"({machine_s / (total / TICKS) if total else 0:.0%}), the command's processes {measured:.0f} of them")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": command, "returncode": returncode, "wall_s": wall, "cores": cores, "machine_busy_cpu_s": machine_s,
        "busy_by_window": {"window_s": args.window, "shares": timeline},
        "by_kind": {kind: {"processes": count[kind], "cpu_s": cpu[kind]} for kind in cpu},
        "by_test": dict(by_test.most_common()), "in_pytest_by_test": dict(inside.most_common()),
        "schedule": ran,
        "processes": [asdict(p) | {"cpu_s": p.cpu_ticks / TICKS} for p in procs.values()]}, indent=1))
    print(f"wrote {args.out}")
    sys.exit(returncode)


if __name__ == "__main__":
    main()
