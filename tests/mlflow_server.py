"""A real ``mlflow server`` (SQLite backend) on a free loopback port, for the MLflow tracking tests:
started once per session, in its own process group, and stopped by PID."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from baton.jobs.services import _wait, die_with_parent, free_port

READY_TIMEOUT_S = 120.0
"""Creating the SQLite schema and importing the server takes ~25 s on a busy 2-core machine."""


@dataclass
class MlflowServer:
    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None
    workdir: Optional[str] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "MlflowServer":
        self.workdir = tempfile.mkdtemp(prefix="baton-mlflow-")
        mlflow = Path(sys.executable).with_name("mlflow")
        log = open(os.path.join(self.workdir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.workdir}/mlflow.db",
             "--default-artifact-root", f"{self.workdir}/artifacts", "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            # no background job runner (a second process importing the server; the tests need none)
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        log.close()
        _wait(self._healthy, f"mlflow server on port {self.port}", self.proc, READY_TIMEOUT_S)
        return self

    def _healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
            return response.status == 200

    def stop(self) -> None:
        """SIGTERM to the server's own process group (the server, its uvicorn and job-runner children,
        started with it in a new session), SIGKILL if it does not exit in time."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
