"""Code that travels with the job: real `baton worker` processes started where the user's package does not
exist, real Redis and S3. A job shipping it trains, survives a SIGKILL bit-exactly, runs the version it
was submitted with, is refused when its archive was changed in the store, and waits for a worker that
accepts shipped code."""
from __future__ import annotations

import tarfile
import textwrap
from pathlib import Path

import pytest

from baton.jobs.code_pack import pack
from baton.schemas.spec import JobSpec
from baton.storage.layout import JobPaths, code_key

from tests.helpers import assert_same_training, kill_when, make_spec, make_wheel, run_reference
from tests.workers.queue.test_worker_loss import running_at_step, wait_for

PACKAGE = "shippedpkg"  # exists nowhere but in the directories these tests write


def write_package(root: Path, version: int) -> Path:
    """A project directory holding ``shippedpkg``, whose model stamps its VERSION into a file when built."""
    package = root / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"VERSION = {version}\n")
    (package / "nets.py").write_text(textwrap.dedent("""
        from pathlib import Path

        from torch import nn

        from shippedpkg import VERSION


        def mlp(stamp: str = "", hidden: int = 32):
            if stamp:
                with open(stamp, "a") as out:
                    out.write(f"{VERSION}\\n")
            return nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 3))


        def needs_dep(hidden: int = 8):
            import tinydep  # installed from the job's code.pip

            return nn.Sequential(nn.Linear(2, hidden * tinydep.FACTOR), nn.ReLU(), nn.Linear(hidden * tinydep.FACTOR, 3))
        """))
    (root / "notes.log").write_text("left out by .gitignore\n")
    (root / ".gitignore").write_text("*.log\n")
    return root


def spec(stamp: Path | None = None, **sections) -> dict:
    return make_spec(model={"target": f"{PACKAGE}.nets:mlp", "kwargs": {"stamp": str(stamp or "")}},
                     data={"target": "tests.probes:slow_spiral", "kwargs": {"n_per_class": 300, "delay_s": 0.003}},
                     checkpoint={"every_steps": 4, "keep_last": 3}, **sections)


@pytest.fixture
def shipping(cluster, monkeypatch):
    monkeypatch.setenv("BATON_ALLOWED_MODULES", f"tests,{PACKAGE}")
    cluster.env["BATON_ALLOWED_MODULES"] = f"tests,{PACKAGE}"
    return cluster


@pytest.mark.slow
def test_a_shipped_job_survives_sigkill_on_workers_without_its_package_bit_exact(shipping, tmp_path, monkeypatch):
    project = write_package(tmp_path / "project", 1)
    shipping.start_workers(2, BATON_ACCEPT_CODE="1")
    job = shipping.client.submit(spec(), "shipped", code=project)
    holder = shipping.worker(wait_for(running_at_step(job, 1)).worker)

    def mid_epoch(manifest: dict) -> bool:
        latest = manifest["checkpoints"][-1] if manifest["checkpoints"] else None
        return latest is not None and latest["kind"] == "step" and latest["batch_in_epoch"] > 0
    kill_when(holder.proc, shipping.store(), "shipped", mid_epoch)

    final = job.wait(timeout=180, progress=False)
    assert final.state.value == "succeeded", final.error
    assert (final.attempt, final.lost) == (2, 1) and final.worker != holder.name
    monkeypatch.syspath_prepend(str(project))  # `baton run` in the project's directory
    reference = run_reference(tmp_path / "reference", spec(), allowed=("tests", PACKAGE))
    assert_same_training(reference, "reference", shipping.store(), "shipped")
    logged = job.logs()
    assert "fetched and unpacked" in logged, logged
    digest = JobSpec.model_validate_json(shipping.store().get_bytes(JobPaths("shipped").spec)).code.digest
    assert job.report()["code"] == {"digest": digest, "pip": []}
    fetched = Path(shipping.client.job("shipped").download(tmp_path / "out", which="code"))
    with tarfile.open(fetched) as tar:
        assert sorted(tar.getnames()) == [".gitignore", f"{PACKAGE}/__init__.py", f"{PACKAGE}/nets.py"]


@pytest.mark.slow
def test_an_archive_changed_in_the_store_is_refused_as_a_loss_and_never_run(shipping, tmp_path):
    stamp = tmp_path / "stamp"
    store = shipping.store()
    # submitted with no worker up: the archive is changed before any runs it
    job = shipping.client.submit(spec(stamp, retry={"max_attempts": 2}), "tampered",
                                 code=write_package(tmp_path / "project", 1))
    shipped = JobSpec.model_validate_json(store.get_bytes(JobPaths("tampered").spec))
    key = code_key(shipped.code.digest)
    store.put_bytes(key, pack(write_package(tmp_path / "evil", 666)).data)  # the same key, other code
    shipping.start_workers(1, BATON_ACCEPT_CODE="1")
    final = job.wait(timeout=120, progress=False)
    assert final.state.value == "failed" and final.lost == 2, final
    assert "changed after submit" in (final.last_event or "") + (final.error or ""), final
    assert not stamp.exists()  # the model was never built


@pytest.mark.slow
@pytest.mark.quick  # (stands for its module in the quick tier)
def test_an_archive_bomb_fails_its_job_in_one_line_and_the_worker_runs_two_versions_of_a_package_after(shipping,
                                                                                                       tmp_path):
    """An archive a quarter of a megabyte big whose header declares 256 MiB (a user's: 1.5 GiB in 1.5 MB took
    the worker to 2 GB of RSS, starved its heartbeat and was recorded as a lost worker): the job fails at
    once, not retried, in one line; the worker lives on and runs the next jobs: two versions of one package,
    each its own."""
    import hashlib

    from tests.workers.test_shipped_code_cache import header_bomb

    worker, = shipping.start_workers(1, BATON_ACCEPT_CODE="1")
    data = header_bomb(1 << 28)
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    shipping.store().put_bytes(code_key(digest), data)
    job = shipping.client.submit(make_spec(code={"digest": digest}, retry={"max_attempts": 3}), "bomb")
    final = job.wait(timeout=120, progress=False)
    assert (final.state.value, final.attempt, final.lost) == ("failed", 1, 0), final.error
    assert "once decompressed" in final.error and "\n" not in final.error, final.error
    assert final.failure == f"error: {final.error}", final.failure  # (one line: no frame of baton's)
    assert "lost" not in [event.kind for event in job.events()]

    stamps = []
    for version in (1, 2):  # two versions of one package, each runs its own on this worker
        stamp = tmp_path / f"stamp-{version}"
        stamps.append(stamp)
        job = shipping.client.submit(spec(stamp, loop={"epochs": 1}), f"v{version}",
                                     code=write_package(tmp_path / f"v{version}", version))
        assert job.wait(timeout=120, progress=False).state.value == "succeeded"
    assert [s.read_text().split() for s in stamps] == [["1"], ["2"]] and worker.proc.poll() is None
    assert "already unpacked" not in shipping.client.job("v2").logs()


@pytest.mark.slow
def test_a_worker_that_does_not_accept_shipped_code_passes_the_job_on(shipping, tmp_path):
    shipping.start_workers(1)  # BATON_ACCEPT_CODE unset
    job = shipping.client.submit(spec(loop={"epochs": 1}), "refused", code=write_package(tmp_path / "project", 1))
    waiting = wait_for(lambda: (s := job.status()).last_event and "BATON_ACCEPT_CODE" in s.last_event and s, timeout=60)
    assert waiting.state.value == "queued" and waiting.attempt <= 1
    # what no live worker offers, known from the worker's own announcement (not "a free worker takes it")
    assert job.status().waiting == "no live worker of queue default accepts shipped code (BATON_ACCEPT_CODE)"
    shipping.start_workers(1, BATON_ACCEPT_CODE="1")
    assert job.wait(timeout=120, progress=False).state.value == "succeeded"


def tiny_wheel(directory: Path) -> Path:
    """A pure-Python wheel of ``tinydep`` 1.0, which no worker has: a package index of one file."""
    return make_wheel(directory, "tinydep", "1.0", {"tinydep/__init__.py": "FACTOR = 2\n"})


@pytest.mark.slow
def test_packages_the_workers_lack_are_installed_once_per_set_and_a_missing_one_fails_clearly(shipping, tmp_path):
    index = tiny_wheel(tmp_path / "index")
    shipping.start_workers(1, BATON_ACCEPT_CODE="1", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index))
    project = write_package(tmp_path / "project", 1)
    needs = make_spec(model={"target": f"{PACKAGE}.nets:needs_dep", "kwargs": {}}, loop={"epochs": 1},
                      code={"pip": ["tinydep==1.0"]})
    for name in ("dep-1", "dep-2"):
        job = shipping.client.submit(needs, name, code=project)
        final = job.wait(timeout=180, progress=False)
        assert final.state.value == "succeeded", final.error
    assert "installed tinydep==1.0" in shipping.client.job("dep-1").logs()
    assert "reused the packages installed on this worker" in shipping.client.job("dep-2").logs()
    missing = shipping.client.submit({**needs, "code": {"pip": ["nosuchpkg==9.9"]}}, "dep-missing", code=project)
    final = missing.wait(timeout=180, progress=False)
    assert final.state.value == "failed" and "pip could not resolve the job's packages" in (final.error or ""), final
    assert "nosuchpkg" in final.error and "Traceback" not in final.error


@pytest.mark.slow
def test_a_two_node_job_with_shipped_code_runs_on_two_workers_without_its_package(shipping, tmp_path):
    stamp = tmp_path / "stamp"
    shipping.start_workers(2, BATON_ACCEPT_CODE="1", BATON_GANG_DISTINCT="worker", BATON_NODE_ADDRESS="127.0.0.1")
    two = spec(stamp, loop={"epochs": 1}, resources={"device": "cpu", "cpu_threads": 1, "processes": 1, "nodes": 2})
    job = shipping.client.submit(two, "two-nodes", code=write_package(tmp_path / "project", 1))
    final = job.wait(timeout=240, progress=False)
    assert final.state.value == "succeeded", final.error
    assert stamp.read_text().split() == ["1", "1"]  # each node's rank built the model from its own copy
    logs = "".join(worker.log() for worker in shipping.workers)
    assert logs.count("fetched and unpacked") == 2, logs
