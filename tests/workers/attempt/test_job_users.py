"""The user a worker's jobs run as (workers/attempt/job_users.py, workers/parallel/job_identity.py): a uid
of its own per worker process, held while it lives, never one an account or a process uses; the settings
a machine cannot honour refused in one line; a process dropped to it for good; what a slot's attempt leaves
(its processes, its HOME, its buffers on /dev/shm) cleared after it. These need root, as a worker that
changes user does (the suite runs as root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from baton.storage import owned_dirs
from baton.workers.attempt.job_users import JobUserError, JobUsers, running_as

from tests.helpers import REPO, baton_env, run_baton

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


def test_baton_health_says_when_jobs_would_run_as_the_workers_own_user(redis_server):
    done = run_baton("health", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER="worker"), timeout=60)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done
    assert done.stderr.startswith("warning: jobs run as this worker's own user, uid 0 (BATON_JOB_USER=worker): "
                                  "a job's code can read this worker's credentials and signal it"), done.stderr
    done = run_baton("health", env=baton_env(BATON_REDIS_URL=redis_server.url, BATON_JOB_USER=""), timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", ""), done


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
    assert JobUsers(job_uids=UIDS).user[0] == 2000000500  # free again once its holder is gone
    second.release()


def test_a_process_that_becomes_the_job_user_cannot_go_back_and_holds_only_its_own():
    users = JobUsers(job_uids=UIDS)
    identity = users.lend()
    try:
        code = ("import json, os, sys, tempfile\n"
                "from baton.schemas.messages import JobIdentity\n"
                "from baton.workers.parallel.job_identity import become\n"
                "become(JobIdentity.model_validate_json(sys.argv[1]))\n"
                "try:\n    os.setuid(0); back = 'went back to root'\nexcept PermissionError: back = 'PermissionError'\n"
                "print(json.dumps({'ids': [os.getuid(), os.geteuid(), os.getgid(), os.getegid()], 'groups': os.getgroups(),"
                " 'home': os.environ['HOME'], 'tmp': tempfile.gettempdir(), 'umask': os.umask(0),"
                " 'own fds': len(os.listdir('/proc/self/fd')) > 0, 'back': back}))")
        done = subprocess.run([sys.executable, "-c", code, identity.model_dump_json()], capture_output=True, text=True,
                              cwd=REPO, env=baton_env(), timeout=60)
        assert done.returncode == 0, done.stderr
        uid = identity.uid
        assert json.loads(done.stdout) == {"ids": [uid] * 4, "groups": [], "home": identity.home, "tmp": identity.home,
                                           "umask": 0o077, "own fds": True, "back": "PermissionError"}
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
        assert escaped.pid in users.clear(identity)
        assert escaped.wait(timeout=10) == -9
        assert running_as(identity.uid) == []
        assert not os.path.exists(os.path.dirname(home)) and not buffers.exists()
    finally:
        escaped.kill()
        owned_dirs.remove(buffers)
        users.release()
