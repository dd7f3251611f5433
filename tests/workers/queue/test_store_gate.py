"""A store gate serves one job's objects to that job's processes, and nothing else to anyone: keys outside
``jobs/<id>/``, a client without the key, a malformed request, a descriptor it may not upload, a call
after the gate closed. (The contract itself, through a gate, is in tests/storage/test_store_contract.py.)"""
from __future__ import annotations

import os
import pickle
import socket
from multiprocessing.connection import Connection

import pytest

from baton.schemas.errors import OutsideJob, StorageUnavailable
from baton.workers.queue import store_gate as gate_module
from baton.storage.stores.file_store import FileStore
from baton.workers.queue.store_gate import StoreGate
from baton.storage.stores.gate_protocol import Request, proof, send_fd, within
from baton.storage.stores.gated import GatedStore
from baton.storage.stores.open import open_store


@pytest.fixture
def backend(tmp_path):
    store = FileStore(tmp_path / "store")
    store.put_bytes("jobs/other/manifest.json", b"the other job's")
    store.put_bytes("code/sha256-abc.tar.gz", b"a team's code")
    store.put_bytes("jobs/mine/manifest.json", b"mine")
    return store


@pytest.fixture
def gate(backend):
    with StoreGate(backend, "mine") as g:
        yield g


@pytest.mark.parametrize("key", [
    "jobs/other/manifest.json", "code/sha256-abc.tar.gz", "jobs/mine/../other/manifest.json", "jobs/mine/./x",
    "jobs/mine//x", "/etc/passwd", "jobs/mine", "jobs/minex/y", "jobs/", "", "jobs/mine/a\\..\\b",
    "jobs/mine/\x00", "jobs/mine/" + "a" * 1100])
def test_every_call_outside_the_jobs_own_objects_is_refused_and_touches_nothing(gate, backend, tmp_path, key):
    store = open_store(gate.url)
    calls = {"get_bytes": lambda: store.get_bytes(key), "size": lambda: store.size(key),
             "list": lambda: store.list(key), "read_versioned": lambda: store.read_versioned(key),
             "get_file": lambda: store.get_file(key, tmp_path / "out"),
             "put_bytes": lambda: store.put_bytes(key, b"planted"),
             "put_if": lambda: store.put_if(key, b"planted", None), "delete": lambda: store.delete(key),
             "copy in": lambda: store.copy(key, "jobs/mine/stolen"),
             "copy out": lambda: store.copy("jobs/mine/manifest.json", key)}
    for name, call in calls.items():
        with pytest.raises(OutsideJob, match="reach only its own objects"):
            call()
    assert not (tmp_path / "out").exists() and not backend.exists("jobs/mine/stolen")
    assert sorted(backend.list("")) == ["code/sha256-abc.tar.gz", "jobs/mine/manifest.json",
                                        "jobs/other/manifest.json"]
    assert backend.get_bytes("jobs/other/manifest.json") == b"the other job's"


def test_the_jobs_own_objects_are_served(gate, backend):
    store = open_store(gate.url)
    assert store.url == backend.url  # what its records name: the store itself, not the gate
    assert store.get_bytes("jobs/mine/manifest.json") == b"mine"
    store.put_bytes("jobs/mine/attempt-1/rows.jsonl", b"{}")
    assert store.list("jobs/mine/") == ["jobs/mine/attempt-1/rows.jsonl", "jobs/mine/manifest.json"]
    assert open_store(store.reopen_url()).get_bytes("jobs/mine/attempt-1/rows.jsonl") == b"{}"  # (its writer's)


def test_within_accepts_plain_keys_and_prefixes_only():
    assert within("jobs/a/", "jobs/a/") and within("jobs/a/attempt-1/logs/0.log", "jobs/a/")
    assert within("jobs/a/attempt-", "jobs/a/") and within("jobs/a/tensorboard/", "jobs/a/")
    assert not within("jobs/a/x/../../b/y", "jobs/a/") and not within("jobs/a/ x", "jobs/a/")


def test_another_gates_key_or_none_is_refused_before_any_request(gate, backend):
    with StoreGate(backend, "other") as theirs:
        stranger = GatedStore(gate.address, theirs.key, backend.url)  # the other job's key, at this job's gate
        with pytest.raises(StorageUnavailable, match="cannot reach the worker's store gate"):
            stranger.get_bytes("jobs/mine/manifest.json")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(gate.address)
    conn = Connection(sock.detach())
    conn.recv_bytes(64)  # the challenge
    conn.send_bytes(b"\x00" * 32)  # a wrong answer
    with pytest.raises(EOFError):
        conn.recv_bytes()  # closed, with nothing served
    conn.close()


def test_a_silent_stranger_is_dropped_after_the_handshakes_timeout(backend, monkeypatch):
    monkeypatch.setattr(gate_module, "HANDSHAKE_S", 0.2)
    with StoreGate(backend, "mine") as g:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(g.address)
        conn = Connection(sock.detach())
        conn.recv_bytes(64)
        with pytest.raises(EOFError):
            conn.recv_bytes()  # it never answered: closed by the gate
        conn.close()
        assert open_store(g.url).get_bytes("jobs/mine/manifest.json") == b"mine"  # the gate serves on


def _authenticated(gate: StoreGate) -> Connection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(gate.address)
    conn = Connection(sock.detach())
    conn.send_bytes(proof(gate.key, conn.recv_bytes(64)))
    assert conn.recv_bytes(16) == b"ok"
    return conn


@pytest.mark.parametrize("frame", [
    pickle.dumps(Request(op="get_bytes", key="jobs/mine/manifest.json")), b"{not json",
    b'{"op": "get_bytes", "key": "jobs/mine/manifest.json", "extra": 1}',
    b'{"op": "chmod", "key": "jobs/mine/manifest.json"}', b'{"op": "get_bytes", "key": 7}',
    b'{"op": "copy", "key": "jobs/mine/manifest.json"}', b'{"op": "get_bytes", "key": "jobs/mine/x", "body": "fd"}'])
def test_a_malformed_request_closes_its_connection_unserved(gate, frame):
    conn = _authenticated(gate)
    conn.send_bytes(frame)
    with pytest.raises(EOFError):
        conn.recv_bytes()
    conn.close()
    assert open_store(gate.url).get_bytes("jobs/mine/manifest.json") == b"mine"


def test_only_a_regular_file_opened_for_reading_may_be_uploaded(gate, backend, tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the job's to read")
    read_end, write_end = os.pipe()
    refused = {"an O_PATH descriptor": os.open(secret, os.O_PATH), "a pipe": read_end,
               "a device": os.open("/dev/zero", os.O_RDONLY), "a write-only file": os.open(secret, os.O_WRONLY)}
    for what, fd in refused.items():
        conn = _authenticated(gate)
        conn.send_bytes(Request(op="put_file", key="jobs/mine/upload", body="fd").model_dump_json().encode())
        send_fd(conn, fd)
        with pytest.raises(EOFError):
            conn.recv_bytes()  # closed unserved
        conn.close()
        os.close(fd)
        assert not backend.exists("jobs/mine/upload"), what
    os.close(write_end)


def test_nothing_is_served_once_the_gate_closed(backend):
    g = StoreGate(backend, "mine")
    store = open_store(g.url)
    assert store.get_bytes("jobs/mine/manifest.json") == b"mine"  # connected before the close
    g.close()
    with pytest.raises(StorageUnavailable):
        store.get_bytes("jobs/mine/manifest.json")
    with pytest.raises(StorageUnavailable):
        open_store(g.url).put_bytes("jobs/mine/late", b"x")
    assert not backend.exists("jobs/mine/late") and not g.directory.exists()


class HeldStore(FileStore):
    """A file store whose put_bytes waits until the test lets it go (a call held in flight)."""

    def __init__(self, root, held, entered):
        super().__init__(root)
        self.held, self.entered = held, entered

    def put_bytes(self, key, data):
        self.entered.set()
        self.held.wait()
        super().put_bytes(key, data)


def test_close_waits_for_the_calls_in_flight_and_refuses_later_ones(tmp_path):
    import threading

    held, entered = threading.Event(), threading.Event()
    backend = HeldStore(tmp_path / "store", held, entered)
    g = StoreGate(backend, "mine")
    store, results = open_store(g.url), []
    writer = threading.Thread(target=lambda: results.append(store.put_bytes("jobs/mine/in-flight", b"x")))
    writer.start()
    assert entered.wait(10)
    closing = threading.Thread(target=g.close)
    closing.start()
    assert g._closed.wait(10)
    with pytest.raises(StorageUnavailable):
        open_store(g.url).get_bytes("jobs/mine/in-flight")  # arrives after the close began: refused
    assert closing.is_alive()  # still waiting for the put in flight
    held.set()
    closing.join(10)
    writer.join(10)
    assert results == [None] and backend.get_bytes("jobs/mine/in-flight") == b"x"  # landed, and said so


def test_a_listing_longer_than_a_frame_comes_whole(gate, backend):
    segment = "s" * 200
    keys = [f"jobs/mine/{segment}/{segment}/{segment}/{segment}/{i:05d}" for i in range(1400)]  # ~1.2 MB of names
    for key in keys:
        backend.put_bytes(key, b"")
    assert open_store(gate.url).list(f"jobs/mine/{segment}/") == keys


def test_the_stores_errors_come_through_as_the_store_raised_them(gate, backend):
    backend.put_bytes("jobs/mine/dir/file", b"x")
    store = open_store(gate.url)
    for call in (lambda s: s.put_bytes("jobs/mine/dir", b"x"), lambda s: s.put_bytes("jobs/mine/dir/file/under", b"x"),
                 lambda s: s.get_bytes("jobs/mine/missing"), lambda s: s.put_if("jobs/mine/dir/file", b"y", None)):
        with pytest.raises(Exception) as direct:
            call(backend)
        with pytest.raises(Exception) as gated:
            call(store)
        assert type(gated.value) is type(direct.value), (direct.value, gated.value)


def test_a_connection_that_keeps_reaching_outside_is_closed(gate):
    store = open_store(gate.url)
    for _ in range(gate_module.MAX_REFUSALS):
        with pytest.raises(OutsideJob):
            store.size("jobs/other/manifest.json")
    with pytest.raises(StorageUnavailable, match="did not answer"):
        store.size("jobs/mine/manifest.json")  # its connection was closed after the last refusal
    assert store.size("jobs/mine/manifest.json") == 4  # a new one is heard


def test_the_jobs_log_is_redacted_with_the_workers_secrets(backend):
    from baton.storage.redaction import Redactor

    with StoreGate(backend, "mine", Redactor({"POOL_TOKEN": "the-pools-token-0123"})) as g:
        open_store(g.url).put_bytes("jobs/mine/attempt-1/logs/0.log", b"boto3 said: the-pools-token-0123\n")
    assert backend.get_bytes("jobs/mine/attempt-1/logs/0.log") == b"boto3 said: ***\n"


def test_a_gate_under_a_long_tmpdir_is_reached_all_the_same(backend, tmp_path, monkeypatch):
    """A socket's path is at most 107 bytes; a worker whose TMPDIR is long binds and is reached through a
    descriptor of the socket's directory."""
    import tempfile

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with StoreGate(backend, "mine") as g:
        assert len(g.address) > 107
        assert open_store(g.url).get_bytes("jobs/mine/manifest.json") == b"mine"
