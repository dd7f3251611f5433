"""One namespace: a user's own packages named jobs, schemas, storage and workers stay the user's,
beside baton's, in a client script, in ``baton run`` and in ``baton worker``.

Everything runs from the user's project directory with only that directory on PYTHONPATH, through
the installed ``baton`` command, as a user would: not from this repository, whose folders carry the
same names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis as redis_lib
import yaml

from baton.jobs.services import WorkerProcess
from baton.storage.layout import JobPaths
from baton.storage.stores.open import open_store

from tests.helpers import make_spec
from tests.conftest import WORKER_READY_S

USER_PACKAGES = ("jobs", "schemas", "storage", "workers")
BATON_COMMAND = str(Path(sys.executable).parent / "baton")

CLIENT = textwrap.dedent("""
    import sys
    import jobs, schemas, storage, workers            # the user's own packages
    from baton import JobClient, JobSpec

    for package in (jobs, schemas, storage, workers):
        assert package.WHOSE == "user", package
    JobSpec.parse(__import__("yaml").safe_load(open("jobs/tiny.yaml")))
    if sys.argv[1:] == ["submit"]:
        job = JobClient().submit("jobs/tiny.yaml", "tiny-on-a-worker")
        status = job.wait(timeout=120, progress=False)
        print(status.state.value, status.error or "")
    else:
        print("the user's packages and baton's, side by side")
""")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project: packages named like baton's folders, a model in ``workers``, data in
    ``jobs`` and a spec in a folder named ``jobs/`` beside a client script."""
    root = tmp_path / "project"
    for name in USER_PACKAGES:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text('WHOSE = "user"\n')
    (root / "workers" / "models.py").write_text(textwrap.dedent("""
        import torch
        import workers                                   # the user's, not baton's
        assert workers.WHOSE == "user"

        def tiny():
            return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    """))
    (root / "jobs" / "data.py").write_text(textwrap.dedent("""
        import torch
        from torch.utils.data import TensorDataset

        def points(seed: int, n: int = 128):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(n, 2, generator=g)
            return TensorDataset(x, (x.sum(1) > 0).long())
    """))
    spec = make_spec(model={"target": "workers.models:tiny", "kwargs": {}},
                     data={"target": "jobs.data:points", "kwargs": {"n": 128}, "batch_size": 16},
                     loop={"epochs": 2}, checkpoint={"every_steps": 4})
    (root / "jobs" / "tiny.yaml").write_text(yaml.safe_dump(spec))
    (root / "client.py").write_text(CLIENT)
    return root


def user_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_") and k != "PYTHONPATH"}
    # (the user's project is in a private directory: its jobs run as the worker's user, as they would on its laptop)
    return {**env, "PYTHONPATH": str(root), "BATON_ALLOWED_MODULES": "workers,jobs", "BATON_JOB_USER": "worker", **extra}


def run_in(root: Path, *command: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_client_script_gets_the_users_packages_and_baton(project):
    done = run_in(project, sys.executable, "client.py", env=user_env(project))
    assert done.returncode == 0, done.stderr
    assert "side by side" in done.stdout


def test_none_of_batons_folders_is_importable_by_its_bare_name(tmp_path):
    for name in USER_PACKAGES:
        done = run_in(tmp_path, sys.executable, "-c", f"import {name}", env=user_env(tmp_path))
        assert done.returncode == 1 and f"No module named '{name}'" in done.stderr, (name, done.stderr)


@pytest.mark.slow
def test_baton_run_trains_the_users_own_packages(project):
    store = project / "store"
    done = run_in(project, BATON_COMMAND, "run", "jobs/tiny.yaml", "--id", "tiny", "--storage", f"file://{store}",
                  "--no-progress", env=user_env(project))
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads(open_store(f"file://{store}").get_bytes(JobPaths("tiny").manifest))
    assert manifest["completed"] is True


@pytest.mark.slow
def test_a_worker_trains_the_users_own_packages(project, redis_server, s3_bucket, s3_env):
    redis_lib.Redis.from_url(redis_server.url).flushdb()
    env = user_env(project, **s3_env, BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"s3://{s3_bucket}/runs",
                   BATON_METRICS_PORT="0")
    worker = WorkerProcess("user@test", env, str(project / "worker.log"), cwd=str(project)).start()
    try:
        worker.wait_ready(WORKER_READY_S)
        done = run_in(project, sys.executable, "client.py", "submit", env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["succeeded"], done.stdout + worker.log()
    finally:
        worker.stop()
