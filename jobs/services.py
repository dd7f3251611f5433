"""Local services for the demo and the tests: a redis-server and an S3 endpoint (moto's server),
each on a free loopback port, started as child processes and stopped by PID.

Never used on a worker's real path: real deployments point BATON_REDIS_URL and AWS_ENDPOINT_URL
at real services.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

READY_TIMEOUT_S = 120.0
"""How long a started service or worker may take to become ready: a worker's forkserver imports torch,
tens of seconds on a loaded machine."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """preexec_fn for children: the kernel sends them SIGTERM when their parent dies (Linux), so an
    interrupted demo or test run leaves no servers or workers behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait(check, what: str, proc: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready within {timeout_s:.0f}s")


def _stop(proc: Optional[subprocess.Popen], timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class RedisServer:
    """``redis-server`` on a free loopback port, keeping nothing on disk; with ``persistent`` it keeps
    every write in an append-only file (fsync always), so ``kill()`` then ``start()`` brings it back
    on the same port with its data, as a restarted production Redis does."""

    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None
    workdir: Optional[str] = None
    persistent: bool = False
    password: Optional[str] = None  # asked of every client (in a config file: a command line is world-readable)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        if self.workdir is None:
            self.workdir = tempfile.mkdtemp(prefix="baton-redis-")
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        config = Path(self.workdir) / "redis.conf"
        config.write_text(f"requirepass {self.password}\n" if self.password else "")
        config.chmod(0o600)
        self.proc = subprocess.Popen(
            [binary, str(config), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *persistence,
             "--dir", self.workdir, "--daemonize", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
        )
        _wait(self._pong, f"redis-server on port {self.port}", self.proc)
        return self

    def _pong(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))

    def kill(self) -> None:
        """SIGKILL by PID, keeping the data directory (``start()`` again restarts from it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        _stop(self.proc)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


@dataclass
class S3Server:
    """moto's S3-compatible HTTP server on a free loopback port (objects live in its memory), its conditional
    writes atomic (``local_s3``)."""

    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard AWS variables a boto3 client needs to talk to this endpoint."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": "baton-local",
                "AWS_SECRET_ACCESS_KEY": "baton-local", "AWS_DEFAULT_REGION": "us-east-1"}

    def start(self) -> "S3Server":
        self.proc = subprocess.Popen([sys.executable, "-m", "baton.jobs.local_s3", "127.0.0.1", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        _wait(self._answers, f"S3 endpoint on port {self.port}", self.proc)
        return self

    def _answers(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1) as response:
            return response.status == 200

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                     aws_access_key_id="baton-local", aws_secret_access_key="baton-local").create_bucket(Bucket=name)

    def stop(self) -> None:
        _stop(self.proc)



@dataclass
class WorkerProcess:
    """A ``baton worker`` in its own process group (so the whole group can be signalled)."""

    name: str
    env: dict[str, str]
    log_path: str
    queues: str = "default"
    cwd: Optional[str] = None
    proc: Optional[subprocess.Popen] = None
    _asked: bool = False  # a graceful stop was asked (a second SIGTERM would cut it short)

    def start(self) -> "WorkerProcess":
        self._asked = False
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "baton", "worker", "--name", self.name, "--queues", self.queues],
                                     env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent)
        log.close()
        return self

    def log(self) -> str:
        with open(self.log_path, "rb") as fh:
            return fh.read().decode(errors="replace")

    @property
    def started(self) -> subprocess.Popen:
        """Its process (``start`` first)."""
        assert self.proc is not None, f"worker {self.name} was not started"
        return self.proc

    @property
    def pid(self) -> int:
        return self.started.pid

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> "WorkerProcess":
        _wait(lambda: f"baton worker {self.name} ready" in self.log(), f"worker {self.name}", self.started, timeout_s)
        return self

    def signal(self, signum: int, group: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)

    def ask_to_stop(self) -> None:
        """Start a graceful stop without waiting for it (``stop`` then waits): many workers stop at once."""
        if self.proc is None or self.proc.poll() is not None or self._asked:
            return
        self._asked = True
        self.signal(signal.SIGCONT)  # in case a test left it stopped
        self.signal(signal.SIGTERM, group=False)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.ask_to_stop()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()


def stop_workers(workers: list[WorkerProcess]) -> None:
    """Stop ``workers`` gracefully, all at once (each takes a second or two)."""
    for worker in workers:
        worker.ask_to_stop()
    for worker in workers:
        worker.stop()
