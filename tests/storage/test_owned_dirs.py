"""Scratch directories named after their process: a dead owner's are removed, a live one's kept,
and a pid reused by another process does not keep a dead owner's directories for ever."""
from __future__ import annotations

import os
import subprocess
import sys

from baton.storage import owned_dirs

PREFIX = "baton-test-"
MAKE_AND_WAIT = ("import sys; from baton.storage import owned_dirs; "
                 "print(owned_dirs.make(sys.argv[1], sys.argv[2]), flush=True); sys.stdin.read()")


def test_a_dead_owners_directory_goes_and_a_live_ones_stays(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", MAKE_AND_WAIT, PREFIX, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        made = tmp_path / os.path.basename(owner.stdout.readline().strip())
        assert made.is_dir() and f"-{owner.pid}-" in made.name
        (made / "step-5.pt").write_bytes(b"x" * 1024)
        assert owned_dirs.remove_orphans(tmp_path, [PREFIX]) == [] and made.is_dir()  # its owner lives
    finally:
        owner.kill()
        owner.wait()
    assert owned_dirs.remove_orphans(tmp_path, [PREFIX]) == [made] and not made.exists()


def test_a_reused_pid_is_not_its_owner_and_other_names_are_left_alone(tmp_path):
    space, pid = owned_dirs.pid_space(), os.getpid()
    started = owned_dirs.start_time(pid)
    reused = tmp_path / f"{PREFIX}{space}-{pid}-{started - 1}-abc"  # this pid, an earlier process's start
    mine = tmp_path / f"{PREFIX}{space}-{pid}-{started}-abc"
    elsewhere = tmp_path / f"{PREFIX}0123456789ab-999999999-5-abc"  # another machine sharing the directory
    older = tmp_path / f"{PREFIX}k3j4h5g6"  # no owner in its name
    for path in (reused, mine, elsewhere, older):
        path.mkdir()
    assert owned_dirs.remove_orphans(tmp_path, [PREFIX]) == [reused]
    assert mine.is_dir() and elsewhere.is_dir() and older.is_dir()


def test_a_forked_child_does_not_keep_a_dead_owners_held_directory(tmp_path):
    """A DataLoader worker forked from the owner must not hold its lock once the owner is gone."""
    # the child says it runs (past os.fork's hooks) before the owner answers: a child not yet scheduled
    # still shares the lock's open file, and the owner's death alone would not free it
    code = ("import os, sys, time; from baton.storage import owned_dirs; "
            "d = owned_dirs.make(sys.argv[1], sys.argv[2], held=True); "
            "r, w = os.pipe(); pid = os.fork()\n"
            "if pid == 0:\n    os.write(w, b'1'); time.sleep(60); os._exit(0)\n"
            "os.read(r, 1); print(d, pid, flush=True); sys.stdin.read()")
    owner = subprocess.Popen([sys.executable, "-c", code, PREFIX, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    made, child = owner.stdout.readline().split()
    try:
        assert owned_dirs.remove_orphans(tmp_path, [PREFIX]) == []  # its owner lives
        owner.kill()
        owner.wait()
        assert owned_dirs.remove_orphans(tmp_path, [PREFIX]) == [tmp_path / os.path.basename(made)]
    finally:
        os.kill(int(child), 9)


def test_two_processes_removing_one_tree_at_once_leave_the_directory_holding_it_as_it_was(tmp_path):
    """As two workers sweeping the same orphan in /tmp do: what one removed first is passed over by the other,
    and the directory holding the tree (``/tmp`` itself) keeps its mode."""
    import threading

    holder = tmp_path / "holder"
    holder.mkdir()
    holder.chmod(0o1777)
    for round in range(5):
        tree = holder / f"tree-{round}"
        for branch in range(20):
            (tree / str(branch)).mkdir(parents=True)
            for leaf in range(25):
                (tree / str(branch) / str(leaf)).touch()
        removers = [threading.Thread(target=_remove_quietly, args=(tree,)) for _ in range(2)]
        for remover in removers:
            remover.start()
        for remover in removers:
            remover.join()
        assert not tree.exists()
        assert holder.stat().st_mode & 0o7777 == 0o1777, oct(holder.stat().st_mode)


def _remove_quietly(tree) -> None:
    try:
        owned_dirs.remove_tree(tree)
    except FileNotFoundError:  # (the other was done before this one began)
        pass
