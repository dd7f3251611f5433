"""Real services for the tests: an S3 endpoint (moto's server) and redis-server, each on a free
loopback port, started once per session and stopped by PID. Tests never touch port 6379."""
from __future__ import annotations

import itertools
import os

import pytest

from jobs.services import RedisServer, S3Server

_bucket_names = itertools.count()


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS variables, pointing this process's boto3 at the test endpoint."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server.env()


@pytest.fixture
def s3_bucket(s3_server, s3_env):
    """A new, empty bucket; returns its name."""
    name = f"t{os.getpid()}-{next(_bucket_names)}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()
