"""Helpers shared by the tests: specs, the ``baton`` command, and comparing training states."""
from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import yaml

from baton.schemas.manifest import CheckpointManifest
from baton.schemas.metrics import deterministic_part
from baton.storage.artifacts import final_files, read_metrics, read_verified
from baton.storage import failpoints
from baton.storage.stores.base import ObjectStore
from baton.storage.checkpoint_io import load_bytes
from baton.storage.layout import JobPaths
from baton.storage.manifest_store import ManifestStore
from baton.storage.state_diff import first_difference
from tests import zygote

REPO = Path(__file__).resolve().parents[1]
BATON = [sys.executable, "-m", "baton"]

BASE_SPEC: dict[str, Any] = {
    "name": "t",
    "seed": 11,
    "model": {"target": "builtin:mlp", "kwargs": {"in_features": 2, "hidden": 32, "out_features": 3, "dropout": 0.2}},
    "data": {"target": "builtin:spiral", "kwargs": {"n_per_class": 300}, "batch_size": 32, "num_workers": 0, "val_fraction": 0.2},
    "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.01},
    "scheduler": {"name": "onecycle", "warmup_fraction": 0.2},
    "loop": {"epochs": 3, "grad_accum_steps": 1, "max_grad_norm": 1.0, "precision": "fp32", "deterministic": True},
    "checkpoint": {"every_steps": 5, "keep_last": 3, "monitor": "val_loss", "mode": "min", "min_interval_s": 0},
    "resources": {"device": "cpu", "cpu_threads": 1},
}
"""Every test job checkpoints where its ``every_steps`` and validations say (``min_interval_s`` 0): the spacing
by time skips checkpoints by the wall clock, so a kill condition on a mid-epoch checkpoint would hold or not
with the machine's speed (tests/workers/attempt/test_checkpoint_spacing.py tests the spacing itself)."""


def make_spec(**sections: dict) -> dict:
    """BASE_SPEC with each named section updated (``kwargs`` replaced whole when given)."""
    spec = copy.deepcopy(BASE_SPEC)
    for name, changes in sections.items():
        if isinstance(changes, dict) and isinstance(spec.get(name), dict):
            spec[name].update(copy.deepcopy(changes))
        else:
            spec[name] = copy.deepcopy(changes)
    return spec


def write_spec(directory: Path, spec: dict, name: str = "job.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(spec))
    return path


def baton_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["BATON_ALLOWED_MODULES"] = "tests"
    # the tests' jobs read and write the tests' private directories: they run as the worker's user, except
    # where a test asks for jobs of their own user (``BATON_JOB_USER=""``: the default, a uid per worker)
    env["BATON_JOB_USER"] = os.environ.get("BATONTEST_JOB_USER", "worker")
    env.pop("BATON_STORAGE_URL", None)
    env.update(extra)
    return env


def run_baton(*args: str, env: Optional[dict] = None, timeout: float = 300, fresh: bool = False) -> subprocess.CompletedProcess:
    """``python -m baton ARGS``, its output captured: forked from the tests' warm server (tests/zygote.py)
    unless ``fresh`` or the server cannot run it, then a new interpreter."""
    env = env or baton_env()
    done = None if fresh else zygote.run(list(args), env, str(REPO), timeout)
    if done is None:
        done = subprocess.run([*BATON, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return done


def start_baton(*args: str, env: Optional[dict] = None, log: Optional[Path] = None, fresh: bool = False,
                capture: bool = False) -> Any:
    """``python -m baton ARGS`` in a session of its own, stdout and stderr to ``log`` (``capture``: to text
    pipes, read by ``communicate``): a ``subprocess.Popen`` or, forked from the tests' warm server
    (tests/zygote.py), as much of one as the tests use."""
    env = env or baton_env()
    out = open(log, "w") if log else None
    try:
        proc = None if fresh else zygote.start(list(args), env, str(REPO), out, capture)
        if proc is None and capture:
            proc = subprocess.Popen([*BATON, *args], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=REPO, start_new_session=True)
        elif proc is None:
            proc = subprocess.Popen([*BATON, *args], env=env, stdout=out or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                    cwd=REPO, start_new_session=True)
    finally:
        if out is not None:
            out.close()  # (the command holds its own copy)
    return proc


def wait_for(predicate: Callable[[], Any], timeout: float = 90, what: str = "a condition", every: float = 0.05) -> Any:
    """``predicate()``'s first true value, asked every ``every`` s; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def scheduler_turns(redis_url: str) -> int:
    """The scheduler's turns made so far on that Redis (``keys.SCHEDULER_TURNS``)."""
    import redis

    from baton.storage.records import keys

    return int(redis.Redis.from_url(redis_url).get(keys.SCHEDULER_TURNS) or 0)


def wait_for_turns(redis_url: str, turns: int, timeout: float = 60) -> None:
    """Until the scheduler has made ``turns`` more turns: it has looked at what Redis holds now, that often."""
    start = scheduler_turns(redis_url)
    wait_for(lambda: scheduler_turns(redis_url) >= start + turns, timeout, f"{turns} turns of the scheduler")


def read_manifest(store: ObjectStore, job_id: str) -> Optional[dict]:
    found = store.read_versioned(JobPaths(job_id).manifest)
    return json.loads(found[0]) if found else None


def uid_of(pid: int) -> int:
    """The real uid ``pid`` runs as."""
    return int(next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Uid:")).split()[1])


def _commit_gate() -> Path:
    """This test process's hold on every job's manifest commits (storage/failpoints.py's ``commit`` pause):
    open (``off`` present) except inside ``kill_when``. Every process the tests start inherits it."""
    folder = Path(tempfile.mkdtemp(prefix="baton-test-commits-"))
    folder.chmod(0o1777)  # (a job running as a user of its own pauses here too)
    (folder / "off").touch()
    os.environ[failpoints.PAUSE_ENV] = str(folder)
    atexit.register(shutil.rmtree, folder, True)
    return folder


COMMIT_GATE = _commit_gate()


def kill_when(proc: subprocess.Popen, store: ObjectStore, job_id: str, ready: Callable[[dict], bool],
              timeout: float = 120, armed: Optional[Callable[[], None]] = None) -> dict:
    """SIGKILL ``proc``'s process group at a moment when its committed manifest satisfies ``ready``.

    While this runs, every change of a manifest waits at its commit (storage/failpoints.py) until this
    looks: the job's committed manifest is read while its next commit waits, so no commit slips between
    the look and the kill, and a job, however fast, cannot finish between two looks (its completion is
    a commit too). A look that does not satisfy ``ready`` lets that commit go on. Returns the manifest
    the job was killed at. ``armed``: called once every commit waits (a test that held its job lets it go on).
    """
    gate, deadline = COMMIT_GATE, time.monotonic() + timeout
    (gate / "off").unlink(missing_ok=True)
    if armed is not None:
        armed()
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"the job ended (rc {proc.returncode}) before the kill condition held")
            if time.monotonic() > deadline:
                raise AssertionError("kill condition never held")
            for waiting in sorted(gate.glob("commit.*"), key=lambda path: path.stat().st_mtime if path.exists() else 0):
                held_job = waiting.name[len("commit."):].rsplit(".", 2)[0]
                manifest = read_manifest(store, job_id) if held_job == job_id else None
                if manifest and ready(manifest):
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return manifest
                waiting.unlink(missing_ok=True)  # that commit goes on
            time.sleep(0.001)
    finally:
        if proc.poll() is None and time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        (gate / "off").touch()
        for waiting in gate.glob("commit.*"):
            waiting.unlink(missing_ok=True)


def manifest_write(job_id: str) -> Callable[[str, str], bool]:
    """A gateway predicate (tests/s3_gateway.py): a write of ``job_id``'s manifest (its commits)."""
    key = f"/jobs/{job_id}/manifest.json"
    return lambda method, path: method in ("PUT", "POST") and path.split("?")[0].endswith(key)


def kill_frozen(proc: subprocess.Popen, gateway: Any, store: ObjectStore, job_id: str, ready: Callable[[dict], bool],
                at: Optional[Callable[[str, str], bool]] = None, log: Optional[Path] = None,
                timeout: float = 120) -> dict:
    """SIGKILL ``proc``'s process group while the job is frozen at a committed manifest that satisfies
    ``ready``: no race between a poll and a job that could finish first.

    The job's storage requests go through ``gateway`` (an S3Gateway: its AWS_ENDPOINT_URL). The first
    request that ``at(method, path)`` picks (default: a commit of its manifest) while the committed
    manifest satisfies ``ready`` is held unanswered, and so is every later one ``at`` picks and every
    later commit: the job can commit nothing more (its completion included) until it is killed. Once
    it is, what was held is discarded, never reaching the store. Returns the committed manifest,
    read again after the kill (and checked again).
    """
    commits = manifest_write(job_id)
    at = at or commits
    frozen = threading.Event()

    def hold(method: str, path: str) -> bool:  # runs in the gateway, before the request is forwarded
        if frozen.is_set():
            return at(method, path) or commits(method, path)
        if at(method, path):
            manifest = read_manifest(store, job_id)
            if manifest and ready(manifest):
                frozen.set()
                return True
        return False

    def said() -> str:
        return log.read_text() if log else ""

    gateway.hold(hold)
    try:
        deadline = time.monotonic() + timeout
        while not frozen.wait(0.01):
            if proc.poll() is not None:
                raise AssertionError(f"the job ended (rc {proc.returncode}) before it was frozen at a manifest "
                                     f"that satisfies the kill condition\n{said()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the job was never frozen at a manifest that satisfies the kill condition\n{said()}")
        assert proc.poll() is None, f"the job ended (rc {proc.returncode}) while frozen\n{said()}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        gateway.discard()
    manifest = read_manifest(store, job_id)
    assert manifest and ready(manifest), manifest
    return manifest


def mid_epoch_after_two_checkpoints() -> Callable[[dict], bool]:
    """True once two mid-epoch checkpoints have been committed and the latest is mid-epoch."""
    seen: set[int] = set()

    def ready(manifest: dict) -> bool:
        seen.update(e["step"] for e in manifest["checkpoints"] if e["kind"] == "step")
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return len(seen) >= 2 and latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    return ready


def final_state(store: ObjectStore, job_id: str) -> dict:
    manifest = read_manifest(store, job_id)
    assert manifest and manifest["completed"], f"job {job_id} did not complete"
    return load_bytes(store.get_bytes(manifest["checkpoints"][-1]["key"]))


def assert_bit_equal(a: Any, b: Any, path: str = "state") -> None:
    """Every tensor torch.equal (same dtype and shape), every other value ==, recursively."""
    difference = first_difference(a, b, path)
    assert difference is None, difference


def committed_manifest(store: ObjectStore, job_id: str) -> CheckpointManifest:
    return ManifestStore(store, JobPaths(job_id)).read()


def metrics_rows(store: ObjectStore, job_id: str) -> list[dict]:
    """The committed metrics rows, found (as every reader finds them) through the manifest."""
    return read_metrics(store, committed_manifest(store, job_id))


def final_model_bytes(store: ObjectStore, job_id: str) -> bytes:
    return read_verified(store, final_files(committed_manifest(store, job_id))["model.safetensors"])


def assert_same_training(store_a: ObjectStore, job_a: str, store_b: ObjectStore, job_b: str) -> None:
    """G1's comparison: final state bit for bit, equal losses, identical exported weights."""
    a, b = final_state(store_a, job_a), final_state(store_b, job_b)
    for part in ("model", "optimizer", "scheduler", "scaler", "progress", "best", "rng"):
        assert_bit_equal(a[part], b[part], part)
    rows_a, rows_b = metrics_rows(store_a, job_a), metrics_rows(store_b, job_b)
    assert [deterministic_part(r) for r in rows_a] == [deterministic_part(r) for r in rows_b]  # val_* included
    assert final_model_bytes(store_a, job_a) == final_model_bytes(store_b, job_b)


def run_reference(root: Path, spec: dict, job_id: str = "reference", allowed: tuple[str, ...] = ("tests",)) -> ObjectStore:
    """``spec`` run uninterrupted to the end in this process (what `baton run` does, without its signal
    handlers and progress bar: no process start-up to pay), in the file store ``root/store``.
    The job's spec sets everything its bits depend on (seed, threads, deterministic algorithms), so
    this equals a run in a fresh process; tests/jobs/test_cli_run.py checks `baton run` itself."""
    from baton.schemas.spec import JobSpec
    from baton.storage.stores.file_store import FileStore
    from baton.workers.attempt.local import register_spec
    from baton.workers.attempt.session import Attempt, AttemptOptions, run_attempt
    from baton.workers.training.control import LoopControl

    class Quiet(LoopControl):
        def log(self, message: str) -> None:
            pass

    store = FileStore(root / "store")
    parsed = JobSpec.parse(spec)
    register_spec(store, JobPaths(job_id), parsed)
    result = run_attempt(Attempt(parsed, job_id, 1, store, allowed_prefixes=allowed), AttemptOptions(Quiet()))
    assert result.outcome.completed, result.outcome
    return store



def descendants(root: int) -> set[int]:
    """Every process below ``root`` now, from /proc (the test's own view, not baton's)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel of ``name`` ``version`` holding ``files`` (path -> text), in ``directory``
    (made if missing): a package index of plain files for ``PIP_FIND_LINKS``."""
    import base64
    import hashlib
    import zipfile

    directory.mkdir(exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(text.encode())}" for path, text in files.items()] + [f"{info}/RECORD,,"]
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as out:
        for path, text in files.items():
            out.writestr(path, text)
        out.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return directory
