"""The ObjectStore contract: one suite, run against every implementation."""
from __future__ import annotations

import threading

import pytest

from baton.schemas.errors import PreconditionFailed


def test_put_get_roundtrip_and_overwrite(store):
    store.put_bytes("a/b/c.bin", b"one")
    assert store.get_bytes("a/b/c.bin") == b"one"
    store.put_bytes("a/b/c.bin", b"two")
    assert store.get_bytes("a/b/c.bin") == b"two"
    assert store.size("a/b/c.bin") == 3


def test_files_roundtrip(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 1000)
    store.put_file("f/x.bin", src)
    dst = tmp_path / "dst.bin"
    store.get_file("f/x.bin", dst)
    assert dst.read_bytes() == src.read_bytes()


def test_objects_larger_than_a_frame_roundtrip(store, tmp_path):
    big = bytes(range(256)) * (12 << 12)  # 12 MiB: a gated store passes it as a file, not in a frame
    store.put_bytes("big/a.bin", big)
    assert store.get_bytes("big/a.bin") == big and store.size("big/a.bin") == len(big)
    store.put_if("big/m.bin", big, None)
    data, version = store.read_versioned("big/m.bin")
    assert data == big
    store.put_if("big/m.bin", big[::-1], version)
    assert store.get_bytes("big/m.bin") == big[::-1]


def test_missing_object_is_file_not_found(store, tmp_path):
    for call in (lambda: store.get_bytes("nope"), lambda: store.size("nope"),
                 lambda: store.get_file("nope", tmp_path / "x"), lambda: store.copy("nope", "other")):
        with pytest.raises(FileNotFoundError):
            call()
    assert not store.exists("nope")
    assert store.read_versioned("nope") is None
    store.delete("nope")  # deleting what is not there is fine


def test_list_by_prefix_sorted(store):
    for key in ("jobs/b/x", "jobs/a/y", "jobs/a/x", "other/z"):
        store.put_bytes(key, b"")
    assert store.list("jobs/a/") == ["jobs/a/x", "jobs/a/y"]
    assert store.list("jobs/") == ["jobs/a/x", "jobs/a/y", "jobs/b/x"]
    store.delete("jobs/a/x")
    assert store.list("jobs/a/") == ["jobs/a/y"]


def test_list_by_a_prefix_that_ends_inside_a_name(store):
    for key in ("jobs/a/attempt-1/x", "jobs/a/attempt-2/y", "jobs/ab/z", "jobs/b/attempt-1/x", "other/z"):
        store.put_bytes(key, b"")
    assert store.list("jobs/a/attempt-") == ["jobs/a/attempt-1/x", "jobs/a/attempt-2/y"]
    assert store.list("jobs/a") == ["jobs/a/attempt-1/x", "jobs/a/attempt-2/y", "jobs/ab/z"]
    assert store.list("jo") == ["jobs/a/attempt-1/x", "jobs/a/attempt-2/y", "jobs/ab/z", "jobs/b/attempt-1/x"]
    assert store.list("jobs/none/") == [] and store.list("nothing/here/") == []


def test_copy(store):
    store.put_bytes("src", b"payload")
    store.copy("src", "dir/dst")
    assert store.get_bytes("dir/dst") == b"payload"


def test_conditional_put_is_a_compare_and_swap(store):
    store.put_if("m.json", b"v1", None)
    with pytest.raises(PreconditionFailed):
        store.put_if("m.json", b"again", None)  # must not exist
    data, version = store.read_versioned("m.json")
    assert data == b"v1"
    store.put_if("m.json", b"v2", version)
    with pytest.raises(PreconditionFailed):
        store.put_if("m.json", b"v3", version)  # stale version
    assert store.get_bytes("m.json") == b"v2"


def test_racing_conditional_puts_have_one_winner(store):
    store.put_if("race", b"initial", None)
    _, version = store.read_versioned("race")
    wins, barrier = [], threading.Barrier(8)

    def contender(i: int) -> None:
        barrier.wait()
        try:
            store.put_if("race", str(i).encode(), version)
            wins.append(i)
        except PreconditionFailed:
            pass

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and store.get_bytes("race") == str(wins[0]).encode()


def test_put_file_consuming_the_source(store, tmp_path):
    scratch = store.scratch_dir() or tmp_path
    src = scratch / "spool.bin"
    src.write_bytes(b"x" * 4096)
    store.put_file("c/spool.bin", src, consume=True)
    assert store.get_bytes("c/spool.bin") == b"x" * 4096
    assert store.list("") == ["c/spool.bin"]  # the scratch file is not an object
