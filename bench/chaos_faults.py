"""The faults bench/chaos.py injects into a running job (its docstring lists them), and how."""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from baton.jobs.services import WorkerProcess
from baton.schemas.settings import BatonSettings
from baton.storage.checkpointing.writer_start import is_writer
from baton.storage.records.messages import make_app, publish_run

from tests.helpers import read_manifest, run_baton

KINDS = ("sigkill", "sigterm", "sigstop", "redis", "s3", "corrupt", "duplicate", "fullspool", "corruptbest", "duprun",
         "shmsweep", "writerkill", "finalize")
FULL_SPOOL_BYTES = 1024
"""The file size the holder's checkpoint writer is held to by a fullspool fault."""
OUTAGE_S = 3.0
"""How long S3 is unreachable, and Redis is down, per fault."""
JOB = "chaos"


def wait_until(predicate, timeout_s: float, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    return None


def _working(pid: int) -> bool:
    """Whether a checkpoint writer has written a checkpoint (it maps the snapshot buffers then)."""
    try:
        return "baton-snapshot-" in (Path("/proc") / str(pid) / "maps").read_text()
    except OSError:
        return False


def _writer_processes(holder: WorkerProcess) -> list[int]:
    """The pids of the holder's checkpoint writer processes (in its process group)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) == holder.proc.pid and is_writer(int(entry.name)):
                pids.append(int(entry.name))
        except (OSError, ProcessLookupError):
            continue
    return pids


SWEEP = ("from pathlib import Path; from baton.storage.memory import memory_dirs; from baton.storage.checkpointing import shared_buffers; "
         "print(len(shared_buffers.remove_orphans(Path('/dev/shm'))) + len(memory_dirs.remove_orphans()))")


def sweep_from_another_namespace(env: dict) -> str:
    """baton's own sweeps of /dev/shm (a worker's start), run in a pid namespace of their own, as another
    container sharing the machine's /dev/shm would run them: they must take only what is provably orphaned."""
    command = [sys.executable, "-c", SWEEP]
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0:
        command = [unshare, "--pid", "--fork", "--mount-proc", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    where = "another pid namespace" if command[0] == unshare else "this pid namespace (no unshare)"
    if done.returncode != 0:
        return f"the sweep failed in {where}: {done.stderr.strip().splitlines()[-1:]}"
    return f"swept /dev/shm from {where}: {done.stdout.strip()} orphaned directories removed"


def _set_file_limit(pids: list[int], limit: int) -> None:
    for pid in pids:
        try:
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
        except (ProcessLookupError, PermissionError):
            pass


def inject(h, kind: str, status) -> str:
    """Inject ``kind`` into the job ``status`` describes, on the chaos.Harness ``h``; a note on what was done."""
    holder = h.holder(status.worker)
    if kind in ("sigkill", "sigterm", "sigstop", "corrupt", "fullspool", "corruptbest", "writerkill") and holder is None:
        return "no live holder"
    if kind == "sigkill":
        holder.signal(signal.SIGKILL)
    elif kind == "sigterm":
        holder.signal(signal.SIGTERM, group=False)
    elif kind == "sigstop":
        holder.signal(signal.SIGSTOP)
        taken = wait_until(lambda: h.status().attempt > status.attempt, 60)
        holder.signal(signal.SIGCONT)
        return "taken over while frozen" if taken else "not taken over in 60 s"
    elif kind == "redis":
        h.redis.kill()
        time.sleep(OUTAGE_S)
        h.redis.start()
    elif kind == "s3":
        h.proxy.set("cut")
        time.sleep(OUTAGE_S)
        h.proxy.set("pass")
    elif kind == "corrupt":
        holder.signal(signal.SIGSTOP)  # nothing commits while the latest is chosen and overwritten
        manifest = read_manifest(h.store, JOB)
        if not manifest or not manifest["checkpoints"]:
            holder.signal(signal.SIGKILL)
            return "no checkpoint yet; SIGKILL only"
        latest = manifest["checkpoints"][-1]
        h.watch.corrupted.add(latest["key"])
        h.store.put_bytes(latest["key"], os.urandom(latest["size"]))
        holder.signal(signal.SIGKILL)
        return f"overwrote {latest['key']}"
    elif kind == "duplicate":
        publish_run(make_app(BatonSettings(redis_url=h.redis.url)), JOB, status.attempt, status.queue)
    elif kind == "fullspool":
        writers = wait_until(lambda: _writer_processes(holder), 30, 0.2)  # it starts beside the attempt's first steps
        if not writers:
            return "no checkpoint writer process in 30 s; nothing injected"
        _set_file_limit(writers, FULL_SPOOL_BYTES)
        taken = wait_until(lambda: h.status().attempt > status.attempt, 60)
        _set_file_limit(writers, resource.RLIM_INFINITY)  # the disk has room again
        return "given up as a loss, taken over" if taken else "not given up in 60 s"
    elif kind == "corruptbest":
        holder.signal(signal.SIGSTOP)  # nothing commits while the best is chosen and overwritten
        manifest = read_manifest(h.store, JOB)
        best = manifest and manifest.get("best")
        if not best:
            holder.signal(signal.SIGCONT)
            return "no best checkpoint yet"
        h.watch.corrupted.add(best["key"])
        h.store.put_bytes(best["key"], os.urandom(best["size"]))
        holder.signal(signal.SIGCONT)
        return f"overwrote the best, {best['key']}"
    elif kind == "duprun":
        done = run_baton("run", str(h.workdir / "job.yaml"), "--id", JOB, "--storage", h.storage_url, "--no-progress",
                         env={k: v for k, v in h.env.items() if k != "AWS_ENDPOINT_URL"} | h.s3.env())
        h.duprun_codes.append(done.returncode)
        return f"baton run exited {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:80]}"
    elif kind == "shmsweep":
        return sweep_from_another_namespace(h.env)
    elif kind == "writerkill":  # as the OOM killer would, at every checkpoint, until the attempt is given up
        killed = []

        def kill_writers():  # once it works: one killed while it starts leaves the checkpoints to a thread
            for pid in filter(_working, _writer_processes(holder)):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            return h.status().attempt > status.attempt

        taken = wait_until(kill_writers, 90, 0.05)
        return (f"{len(killed)} writer process(es) killed; given up as a loss, taken over" if taken else
                f"{len(killed)} writer process(es) killed; not given up in 90 s")
    elif kind == "finalize":
        h.redis.kill()
        time.sleep(OUTAGE_S)
        h.redis.start()
    return ""
