"""A worker whose training processes cannot import their code (here: a torch that fails to import, as a
broken install or a missing shared library does) refuses to start, saying why, before it takes a job;
its main process, which imports no torch, would otherwise look ready and lose every job it claimed."""
from __future__ import annotations

import pytest

from tests.helpers import baton_env


@pytest.mark.slow
def test_a_worker_whose_training_code_cannot_import_torch_refuses_to_start(redis_server, tmp_path):
    import redis

    from baton.jobs.services import WorkerProcess
    from baton.workers.queue.worker_main import EXIT_REFUSED

    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("libtorch_cpu.so: cannot open shared object file")\n')
    redis.Redis.from_url(redis_server.url).flushdb()
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_STORAGE_URL=f"file://{tmp_path / 'store'}",
                    BATON_METRICS_PORT="0")
    env["PYTHONPATH"] = f"{tmp_path / 'site'}:{env['PYTHONPATH']}"
    worker = WorkerProcess("broken@test", env, str(tmp_path / "w.log")).start()
    try:
        assert worker.started.wait(timeout=120) == EXIT_REFUSED, worker.log()
    finally:
        worker.stop()
    log = worker.log()
    assert "baton worker broken@test: refusing to start: a training process could not import" in log, log
    assert "libtorch_cpu.so: cannot open shared object file" in log  # the child's traceback, above it
    assert "ready" not in log
