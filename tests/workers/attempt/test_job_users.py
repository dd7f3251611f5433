"""The user a worker's jobs run as (workers/attempt/job_users.py, workers/parallel/job_identity.py): a uid
of its own per worker process, held while it lives, never one an account or a process uses; the settings
a machine cannot honour refused in one line; a process dropped to it for good; what a slot's attempt leaves
(its processes, its HOME, its buffers on /dev/shm) cleared after it. These need root, as a worker that
changes user does (the suite runs as root)."""
from __future__ import annotations

import grp
import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from baton.jobs.services import RedisServer
from baton.storage import owned_dirs
from baton.workers.attempt.job_users import LOCK_DIRS, JobUserError, JobUsers
from baton.workers.attempt import uid_leftovers
from baton.workers.attempt.uid_leftovers import running_as
from baton.workers.parallel import failure_report

from tests.helpers import BATON, REPO, baton_env, run_baton, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")

UIDS = "2000000500-2000000502"


@pytest.mark.quick
@pytest.mark.parametrize("setting, said", [
    ("nosuchuser", "BATON_JOB_USER='nosuchuser': no such user on this machine"),
    ("root", "BATON_JOB_USER='root': jobs may not run as root"),
    ("0:5", "BATON_JOB_USER='0:5': jobs may not run as root"),
    ("7-3", "BATON_JOB_USER='7-3': expected a range of uids, FIRST-LAST"),
    ("65534:staff", "BATON_JOB_USER='65534:staff': expected USER, UID or UID:GID"),
])
def test_a_job_user_this_machine_cannot_honour_is_refused_in_one_line(setting, said):
    with pytest.raises(JobUserError) as caught:
        JobUsers(setting, claim=False)
    assert str(caught.value).startswith(said)


def test_baton_worker_refuses_a_job_user_it_cannot_honour_before_it_starts(redis_server, tmp_path):
    done = run_baton("worker", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER="nosuchuser",
                                             BATON_STORAGE_URL=(tmp_path / "store").as_uri()), timeout=60)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines()[-1] == "baton worker: BATON_JOB_USER='nosuchuser': no such user on this machine"
    assert "Traceback" not in done.stderr


OPEN_REDIS = ("warning: Redis answers without a password: anyone who reaches it, a job's code on this machine "
              "included, can read and change every job's record")


def test_baton_health_says_when_jobs_would_run_as_the_workers_own_user_and_when_redis_lets_strangers_in(redis_server):
    done = run_baton("health", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER="worker"), timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done
    assert done.stderr.startswith("warning: jobs run as this worker's own user, uid 0 (BATON_JOB_USER=worker): "
                                  "a job's code can read this worker's credentials and signal it"), done.stderr
    done = run_baton("health", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER=""), timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n") and done.stderr.startswith(OPEN_REDIS), done  # (no password)
    guarded = RedisServer(password=f"pool-{secrets.token_hex(8)}").start()
    try:
        done = run_baton("health", env=baton_env(BATON_REDIS_URL=guarded.url, BATON_JOB_USER=""), timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", ""), done
    finally:
        guarded.stop()


def test_each_worker_process_holds_a_uid_of_its_own_and_passes_over_one_in_use():
    first, second = JobUsers(job_uids=UIDS), JobUsers(job_uids=UIDS)  # (two locks: as two worker processes)
    assert (first.user, second.user) == ((2000000500,) * 2 + ("baton-job-2000000500",),
                                         (2000000501,) * 2 + ("baton-job-2000000501",))
    squatter = subprocess.Popen(["sleep", "60"], user=2000000502, group=2000000502)
    try:
        with pytest.raises(JobUserError, match="no free uid for this worker's jobs in 2000000500-2000000502"):
            JobUsers(job_uids=UIDS)  # the last is not held, but a process runs as it: not this worker's to take
    finally:
        squatter.kill()
        squatter.wait()
    first.release()
    again = JobUsers(job_uids=UIDS)
    assert again.user[0] == 2000000500  # free again once its holder is gone
    again.release()
    second.release()


def test_a_process_that_becomes_the_job_user_cannot_go_back_and_holds_only_its_own():
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    try:
        code = ("import json, os, sys, tempfile\n"
                "from multiprocessing import resource_tracker, util\n"
                "from baton.schemas.messages import JobIdentity\n"
                "from baton.workers.parallel.job_identity import become\n"
                "resource_tracker.ensure_running(); tracker = resource_tracker.getfd()\n"  # (as a forkserver's child has)
                "util.get_temp_dir()\n"
                "become(JobIdentity.model_validate_json(sys.argv[1]))\n"
                "try:\n    os.fstat(tracker); tracker = 'still open'\nexcept OSError: tracker = 'closed'\n"
                "try:\n    os.setuid(0); back = 'went back to root'\nexcept PermissionError: back = 'PermissionError'\n"
                "print(json.dumps({'ids': [os.getuid(), os.geteuid(), os.getgid(), os.getegid()], 'groups': os.getgroups(),"
                " 'home': os.environ['HOME'], 'tmp': tempfile.gettempdir(), 'umask': os.umask(0),"
                " 'own fds': len(os.listdir('/proc/self/fd')) > 0, 'back': back, 'tracker': tracker,"
                " 'mp tmp': os.path.dirname(util.get_temp_dir())}))")
        done = subprocess.run([sys.executable, "-c", code, identity.model_dump_json()], capture_output=True, text=True,
                              cwd=REPO, env=baton_env(), timeout=60)
        assert done.returncode == 0, done.stderr
        uid = identity.uid
        assert json.loads(done.stdout) == {"ids": [uid] * 4, "groups": [], "home": identity.home, "tmp": identity.home,
                                           "umask": 0o077, "own fds": True, "back": "PermissionError",
                                           "tracker": "closed", "mp tmp": identity.home}
    finally:
        users.clear(identity)
        users.release()


def test_what_a_slots_attempt_leaves_is_cleared_after_it():
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    home = identity.home
    assert os.stat(home).st_uid == identity.uid and os.stat(home).st_mode & 0o777 == 0o700
    escaped = subprocess.Popen(["sleep", "60"], user=identity.uid, group=identity.gid, start_new_session=True)
    buffers = owned_dirs.make(owned_dirs.SNAPSHOT_PREFIX, owned_dirs.SHM, held=True)
    os.chown(buffers, identity.uid, identity.gid)
    os.close(owned_dirs._held.pop(buffers))  # as its maker, the job's checkpoint writer, left it: killed
    try:
        users.clear(identity)
        assert escaped.wait(timeout=10) == -9
        assert running_as(identity.uid) == []
        assert not os.path.exists(os.path.dirname(home)) and not buffers.exists()
    finally:
        escaped.kill()
        owned_dirs.remove(buffers)
        users.release()


def test_the_clear_after_an_attempt_runs_beside_the_worker_and_the_next_attempt_waits_for_it():
    users = JobUsers(job_uids=UIDS)
    try:
        with users.lent() as tenancy:
            identity = tenancy.identity
            escaped = subprocess.Popen(["sleep", "60"], user=identity.uid, group=identity.gid, start_new_session=True)
        again = users.lend()  # (at once: the clear may be under way)
        assert escaped.wait(timeout=10) == -9 and running_as(identity.uid) == []
        assert not users.dirty and not os.path.exists(os.path.dirname(identity.home))
        users.clear(again)
    finally:
        users.release()


def test_the_clearer_kept_ready_is_out_of_its_workers_process_group_and_one_that_died_is_replaced():
    """A Ctrl-C or a stop of the worker's whole group, which the worker acts on gracefully, does not reach
    it; one ended anyway (here by SIGKILL) is replaced by a new one at the clear."""
    users = JobUsers(job_uids=UIDS)
    try:
        ready = users._clearer._proc
        assert os.getpgid(ready.pid) not in (os.getpgrp(), 0) and os.getsid(ready.pid) == ready.pid
        ready.kill()
        ready.wait()
        with users.lent() as tenancy:
            identity = tenancy.identity
            escaped = subprocess.Popen(["sleep", "60"], user=identity.uid, group=identity.gid, start_new_session=True)
        users.settle()
        assert escaped.wait(timeout=10) == -9 and not users.dirty
    finally:
        users.release()


def test_what_an_attempt_was_lent_to_write_in_can_be_removed_once_its_clear_is_settled(open_dir):
    """Its processes may go on writing there until its clear ends (``settle``): removed after it, it stays removed."""
    users = JobUsers(job_uids=UIDS)
    lent = open_dir / "copies"
    lent.mkdir(mode=0o700)
    code = "import os, sys, itertools\nfor n in itertools.count():\n    open(os.path.join(sys.argv[1], str(n)), 'w').close()\n"
    try:
        with users.lent() as tenancy:
            tenancy.write([str(lent)])
            identity = tenancy.identity
            writer = subprocess.Popen([sys.executable, "-c", code, str(lent)], user=identity.uid, group=identity.gid,
                                      start_new_session=True)
            assert wait_for(lambda: len(os.listdir(lent)) > 10, timeout=30)
        users.settle()
        assert writer.wait(timeout=10) == -9
        owned_dirs.remove_tree(lent)
        assert not lent.exists()
    finally:
        users.release()


def test_a_killed_workers_slot_is_free_again_once_it_is_gone():
    """The clearing interpreter kept ready holds the slot's lock while it lives, and ends with its worker."""
    code = ("import os, signal\nfrom baton.workers.attempt.job_users import JobUsers\n"
            f"users = JobUsers(job_uids={UIDS!r}); print(users.user[0], flush=True); os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=baton_env(), timeout=60)
    assert done.returncode == -9 and done.stdout.strip() == "2000000500", done
    users = wait_for(lambda: _taking(UIDS, 2000000500), timeout=30)
    users.release()


def _taking(uids: str, uid: int):
    users = JobUsers(job_uids=uids)
    if users.user[0] == uid:
        return users
    users.release()
    return None


def test_a_slots_processes_that_fork_again_and_again_are_all_ended():
    """Each forks a child and exits at once, so no pid lives long enough for a kill by pid: all are ended."""
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    # under a reaper of its own (as a worker is its training processes' subreaper): their zombies go to it
    code = ("import ctypes, os, sys\n"
            "ctypes.CDLL(None).prctl(36, 1)\n"  # PR_SET_CHILD_SUBREAPER
            "if os.fork() == 0:\n"
            "    os.setgroups([]); os.setresgid(*[int(sys.argv[2])] * 3); os.setresuid(*[int(sys.argv[1])] * 3)\n"
            "    while True:\n        if os.fork():\n            os._exit(0)\n"
            "while True:\n    try:\n        os.waitpid(-1, 0)\n    except ChildProcessError:\n        break\n")
    reaper = subprocess.Popen([sys.executable, "-c", code, str(identity.uid), str(identity.gid)])
    try:
        assert wait_for(lambda: running_as(identity.uid), timeout=30)
        users.clear(identity)
        assert running_as(identity.uid) == []
        assert reaper.wait(timeout=30) == 0  # nothing left for it to reap
    finally:
        uid_leftovers.Clearer().clear(identity.uid)
        reaper.kill()
        reaper.wait()
        users.release()


@pytest.mark.parametrize("signal_name", ["SIGSTOP", "SIGKILL"])
def test_a_slots_processes_signalling_all_they_can_do_not_stop_their_end(signal_name):
    """The job's processes send ``kill(-1)`` again and again (each process of their user stopped, or killed):
    what ends them is not of their user, so it ends them all and returns."""
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    # each begins once all are running (one started earlier would stop or kill the next before its exec)
    code = f"import os, signal, sys\nsys.stdin.read(1)\nwhile True:\n    os.kill(-1, signal.{signal_name})\n"
    attackers: list[subprocess.Popen] = []
    count = 3 if signal_name == "SIGSTOP" else 1  # (killers all at once may kill each other: one lives on)
    try:
        for _ in range(count):
            attackers.append(subprocess.Popen([sys.executable, "-c", code], user=identity.uid, group=identity.gid,
                                              stdin=subprocess.PIPE))
        for attacker in attackers:
            try:
                attacker.stdin.write(b"go")
                attacker.stdin.close()
            except BrokenPipeError:  # (killed already by one that began)
                pass
        assert wait_for(lambda: len(running_as(identity.uid)) >= count, timeout=30)
        users.clear(identity)
        assert all(attacker.wait(timeout=30) == -9 for attacker in attackers)
        assert running_as(identity.uid) == []
        assert not users.dirty  # (cleared: lent again as it is)
    finally:
        for attacker in attackers:
            attacker.kill()
            attacker.wait()
        users.release()


def test_what_a_slots_user_made_where_every_user_may_write_is_removed_and_links_are_not_followed(open_dir):
    """Its files and directories in /tmp and /dev/shm, its System V memory, removed; what a link of its led
    to kept; what it put in another user's drop box (a directory all may write in) is that user's to keep."""
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    kept = open_dir / "the worker's"
    kept.write_text("root's")
    tag = f"baton-test-left-{os.getpid()}"
    made = [Path(tempfile.gettempdir()) / tag, owned_dirs.SHM / tag, Path(tempfile.gettempdir()) / f"{tag}-dir",
            open_dir / f"{tag}-deeper", Path(tempfile.gettempdir()) / f"{tag}-link"]
    code = ("import ctypes, os, sys\n"
            "a, b, c, d, link, kept = sys.argv[1:]\n"
            "for path in (a, b, d): open(path, 'w').write('secret')\n"
            "os.mkdir(c); open(os.path.join(c, 'inside'), 'w').write('secret'); os.symlink(kept, os.path.join(c, 'to-kept'))\n"
            "os.symlink(kept, link)\n"
            "assert ctypes.CDLL(None).shmget(0, 4096, 0o1600) >= 0\n")  # IPC_PRIVATE, IPC_CREAT | 0600: System V memory
    shm_of = lambda uid: [row for row in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]  # noqa: E731
                          if row.split()[7] == str(uid)]
    try:
        done = subprocess.run([sys.executable, "-c", code, *map(str, made), str(kept)], user=identity.uid,
                              group=identity.gid, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert all(os.path.lexists(path) for path in made) and len(shm_of(identity.uid)) == 1
        users.clear(identity)
        assert [path for path in made if os.path.lexists(path)] == [made[3]] and shm_of(identity.uid) == []
        assert kept.read_text() == "root's"
    finally:
        for path in made:
            subprocess.run(["rm", "-rf", str(path)], check=False)
        users.release()


def test_locks_a_jobs_user_plants_do_not_keep_a_worker_from_its_slot_and_zombies_hold_no_uid():
    first = 2000000500
    planted = [Path(tempfile.gettempdir()) / f"baton-job-uid-{uid}.lock" for uid in range(first, first + 3)]
    for path in planted:  # where they were once kept: the temporary directory, which every user writes in
        if not path.exists():
            path.touch()
            os.chown(path, first + 10, first + 10)
    zombie = subprocess.Popen(["true"], user=first, group=first)
    try:
        assert os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # (it has exited, and is not reaped)
        assert zombie.pid not in running_as(first)
        users = JobUsers(job_uids=UIDS)
        assert users.user[0] == first
        info = LOCK_DIRS[0].lstat()
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and info.st_mode & 0o777 == 0o700
        users.release()
    finally:
        zombie.wait()
        for path in planted:
            if path.stat().st_uid == first + 10:
                path.unlink()


def test_a_number_a_group_of_this_machine_has_is_never_a_slot():
    gid = next(g.gr_gid for g in grp.getgrall() if g.gr_gid > 0 and not _has_account(g.gr_gid))
    with pytest.raises(JobUserError, match="no free uid"):
        JobUsers(job_uids=f"{gid}-{gid}")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_a_fifo_in_place_of_a_lock_or_a_failure_report_is_passed_over(tmp_path):
    """A directory lent to a job's user may hold a FIFO where the worker, as root, opens a file: it never waits."""
    swept = tmp_path / "baton-test-fifo-x"
    swept.mkdir()
    os.mkfifo(swept / owned_dirs.OWNER_LOCK)
    assert owned_dirs.remove_orphans(tmp_path, ("baton-test-fifo-",)) == [] and swept.exists()
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    os.mkfifo(failure_report.report_path(ranks, 0))
    os.symlink("/etc/hostname", failure_report.report_path(ranks, 2))
    try:
        raise RuntimeError("rank 1 failed")
    except RuntimeError as exc:
        failure_report.write(ranks, 1, exc)
    assert failure_report.read_earliest(ranks).rank == 1


def test_a_file_store_other_users_may_enter_is_refused_where_jobs_run_as_their_own(redis_server, open_dir):
    store = open_dir / "store"
    store.mkdir(mode=0o755)
    store.chmod(0o755)
    with pytest.raises(JobUserError, match=r"other users may enter that directory \(drwxr-xr-x\)"):
        JobUsers(job_uids=UIDS, claim=False).check_store(store.as_uri())
    JobUsers("worker").check_store(store.as_uri())  # (its jobs are its own user: nothing to keep them from)
    done = run_baton("worker", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER="",
                                             BATON_STORAGE_URL=store.as_uri()), timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert done.stderr.strip().splitlines()[-1].startswith(f"baton worker: BATON_STORAGE_URL='{store.as_uri()}': other users")
    made = open_dir / "new-store"
    from baton.storage.stores.file_store import FileStore

    FileStore(made)  # a store made by baton is its user's alone
    assert made.stat().st_mode & 0o777 == 0o700
    JobUsers(job_uids=UIDS, claim=False).check_store(made.as_uri())


def test_a_root_worker_whose_jobs_could_not_read_its_directory_refuses_to_start_rather_than_run_them_as_root(
        redis_server, tmp_path):
    private = tmp_path / "project"
    private.mkdir(mode=0o700)
    env = baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER="", BATON_STORAGE_URL=(tmp_path / "store").as_uri())
    done = subprocess.run([*BATON, "worker"], cwd=private, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    closed = next(place for place in [*reversed(private.parents), private] if not place.stat().st_mode & 0o001)
    assert done.stderr.strip().splitlines()[-1] == (
        f"baton worker: jobs run as users of their own, who cannot read {private} ({closed} is mode "
        f"{stat.filemode(closed.stat().st_mode)}): make it readable by all (jobs import from it), or set "
        "BATON_JOB_USER=worker to run them as this worker's user (uid 0)")
