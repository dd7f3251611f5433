"""A user whose environment holds only BATON_SERVER_URL and a token (no Redis URL, no store, no AWS
variables) submits (with shipped code), sweeps, searches, follows, reads, fetches and acts on jobs, and
reads the queue, through a real ``baton server``, from the command line and from ``JobClient()``; an admin
runs the pool's settings the same way; a refusal is one line and an exit code."""
from __future__ import annotations

import hashlib
import json
import os
import tarfile

import pytest
import torch
from safetensors.torch import load_file

from tests.dashboard.conftest import start_server, stop
from tests.dashboard.test_server_roles import WAITING, _user, pool  # noqa: F401 - the server and its users' tokens
from tests.helpers import REPO, make_spec, run_baton, write_spec
from tests.workers.queue.test_shipped_code import PACKAGE, spec as shipped_spec, write_package


def _user_env(server, token: str, home) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(REPO), "BATON_SERVER_URL": server.url,
            "BATON_TOKEN": token}


def test_the_readme_flow_through_the_server_with_nothing_but_a_token(cluster, pool, tmp_path, monkeypatch):  # noqa: F811
    server, tokens = pool
    cluster.start_workers(1)
    env = _user_env(server, tokens["ada"], tmp_path)
    spec = write_spec(tmp_path, make_spec(resources={"team": "vision"}))
    submitted = run_baton("submit", str(spec), "--wait", env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[0]
    assert "BATON_REDIS_URL" not in submitted.stderr

    shown = run_baton("status", job_id, env=env)
    assert shown.returncode == 0 and "succeeded" in shown.stdout and "submitted by: ada" in " ".join(shown.stdout.split())
    assert job_id in run_baton("list", env=env).stdout
    logs = run_baton("logs", job_id, env=env)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    for which in ("final", "best", "latest"):
        fetched = run_baton("fetch", job_id, "--which", which, "-o", str(tmp_path / which), env=env)
        assert fetched.returncode == 0, (which, fetched.stderr)
    direct = cluster.client.job(job_id).download(tmp_path / "direct", "final")
    through = tmp_path / "final" / job_id
    weights, expected = load_file(through / "model.safetensors"), load_file(direct / "model.safetensors")
    assert weights.keys() == expected.keys() and all(torch.equal(weights[k], expected[k]) for k in weights)

    held = write_spec(tmp_path, WAITING, "held.yaml")
    queued = run_baton("submit", str(held), "--id", "ada-held", env=env)
    assert queued.returncode == 0, queued.stderr
    assert run_baton("priority", "ada-held", "3", env=env).returncode == 0
    assert cluster.client.job("ada-held").status().priority == 3
    assert run_baton("cancel", "ada-held", env=env).returncode == 0
    assert run_baton("resume", "ada-held", env=env).returncode == 0
    assert cluster.client.job("ada-held").status().attempt == 0 and cluster.client.job("ada-held").status().state.value \
        in ("queued", "retrying")

    # another team's user: one line, exit 1, nothing changed
    bob = _user_env(server, tokens["bob"], tmp_path)
    refused = run_baton("cancel", "ada-held", env=bob)
    assert refused.returncode == 1 and "refused (403)" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    wrong = run_baton("status", env={**bob, "BATON_TOKEN": "bt_" + "x" * 43})
    assert wrong.returncode == 1 and "(401)" in wrong.stderr
    bad_spec = write_spec(tmp_path, {**WAITING, "optimizer": {"lr": "fast"}}, "bad.yaml")
    invalid = run_baton("submit", str(bad_spec), env=env)
    assert invalid.returncode == 2 and "optimizer" in invalid.stderr, invalid.stderr
    down = run_baton("status", env={**env, "BATON_SERVER_URL": "http://127.0.0.1:1"})
    assert down.returncode == 5 and "cannot reach the pool's server" in down.stderr

    # from Python, the same
    for name in ("BATON_REDIS_URL", "BATON_STORAGE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATON_SERVER_URL", server.url)
    monkeypatch.setenv("BATON_TOKEN", tokens["ada"])
    from baton.jobs.client import JobClient

    client = JobClient()
    job = client.submit(make_spec(resources={"team": "vision"}))
    assert job.wait(timeout=180, progress=False).state.value == "succeeded"
    assert job.status().submitted_by == "ada" and job.metrics() and job.report()
    assert [e.kind for e in job.events()][0] == "submitted"


def test_an_admin_runs_the_pool_through_the_server_and_a_member_may_not(cluster, pool, tmp_path):  # noqa: F811
    server, tokens = pool
    root, ada = _user_env(server, tokens["root"], tmp_path), _user_env(server, tokens["ada"], tmp_path)
    added = run_baton("users", "add", "eve", "--team", "vision", env=root)
    assert added.returncode == 0, added.stderr
    assert _principals_of(cluster).authenticate(added.stdout.strip()).name == "eve"
    assert "eve" in run_baton("users", "list", env=root).stdout
    again = run_baton("users", "add", "eve", "--team", "vision", env=root)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert run_baton("teams", "set", "vision", "--max-priority", "7", env=root).returncode == 0
    assert run_baton("teams", "list", env=ada).stdout.strip() == "vision: max priority 7"
    for args in (("users", "list"), ("users", "add", "mal", "--role", "admin"), ("teams", "set", "vision",
                                                                               "--max-priority", "99"), ("audit",)):
        refused = run_baton(*args, env=ada)
        assert refused.returncode == 1 and "refused (403)" in refused.stderr, (args, refused.stderr)
    assert _principals_of(cluster).get("mal") is None
    assert run_baton("users", "token", "eve", "--rotate", env=root).returncode == 0
    assert run_baton("users", "rm", "eve", env=root).returncode == 0
    gone = run_baton("users", "rm", "eve", env=root)
    assert gone.returncode == 1 and "no user eve" in gone.stderr
    trail = run_baton("audit", "--user", "ada", env=root)
    assert trail.returncode == 0 and "ada users.list - refused" in trail.stdout, trail.stdout
    unsupported = run_baton("recover", "--all", env=root)
    assert unsupported.returncode == 1 and "not done through the pool's server" in unsupported.stderr


def _principals_of(cluster):
    from tests.dashboard.test_server_roles import _principals

    return _principals(cluster)


@pytest.fixture
def shipping_pool(cluster):
    """A server whose pool allows the shipped package, its users (an admin, ada of vision, bob of nlp)."""
    cluster.env["BATON_ALLOWED_MODULES"] = f"tests,{PACKAGE}"
    tokens = {"root": _user(cluster, "root", "--role", "admin"), "ada": _user(cluster, "ada", "--team", "vision"),
              "bob": _user(cluster, "bob", "--team", "nlp")}
    server = start_server(cluster.env, cluster.log_dir / "server.log")
    yield server, tokens
    stop(server.proc)


@pytest.mark.slow
def test_code_sweeps_searches_and_the_queue_through_the_server(cluster, shipping_pool, tmp_path):
    from baton.storage.layout import JobPaths, code_key

    server, tokens = shipping_pool
    cluster.start_workers(1, BATON_ACCEPT_CODE="1")
    env, bob, root = (_user_env(server, tokens[name], tmp_path) for name in ("ada", "bob", "root"))
    project = write_package(tmp_path / "project", 1)
    spec = write_spec(tmp_path, shipped_spec(resources={"team": "vision"}))
    valid = run_baton("validate", str(spec), env=env)  # (its targets checked here; the modules allowed, by the server)
    assert valid.returncode == 0 and "checked by the pool's server" in valid.stdout, valid.stderr
    elsewhere = write_spec(tmp_path, {**shipped_spec(), "data": {"target": "collections:OrderedDict"}}, "other.yaml")
    refused = run_baton("validate", str(elsewhere), env=env)
    assert refused.returncode == 2 and "module 'collections' is not allowed" in refused.stderr, refused.stderr
    submitted = run_baton("submit", str(spec), "--code", str(project), "--id", "ada-shipped", "--wait", env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    digest = json.loads(cluster.store().get_bytes(JobPaths("ada-shipped").spec))["code"]["digest"]
    assert digest and cluster.store().exists(code_key(digest)), digest
    fetched = run_baton("fetch", "ada-shipped", "--which", "code", "-o", str(tmp_path / "code"), env=env)
    assert fetched.returncode == 0, fetched.stderr
    archive = tmp_path / "code" / "ada-shipped" / f"code-{digest.split(':')[1]}.tar.gz"
    assert archive.read_bytes() == cluster.store().get_bytes(code_key(digest))
    with tarfile.open(archive) as tar:
        assert tar.extractfile(f"{PACKAGE}/nets.py").read() == (project / PACKAGE / "nets.py").read_bytes()

    # the code routes: a stranger stores nothing; bytes must hash to the name they are stored under
    data = b"not the archive"
    named = f"sha256:{hashlib.sha256(b'other').hexdigest()}"
    assert server.call("PUT", f"/api/code/{named}", data=data)[0] == 401
    status, answer = server.call("PUT", f"/api/code/{named}", data=data, token=tokens["ada"])
    assert status == 422 and "not " + named in answer["detail"] and not cluster.store().exists(code_key(named))
    assert server.call("GET", f"/api/code/{digest}", token=tokens["bob"]) == (200, {"digest": digest, "exists": True})

    waiting = write_spec(tmp_path, {**shipped_spec(resources={"team": "vision", "queue": "nobody-serves"})}, "wait.yaml")
    swept = run_baton("sweep", str(waiting), "--grid", "optimizer.lr=0.01,0.02", "--code", str(project), "--id",
                      "ada-sweep", env=env)
    assert swept.returncode == 0 and "2 jobs queued" in swept.stdout, swept.stderr
    assert cluster.client.job("ada-sweep-1").status().submitted_by == "ada"
    listed = run_baton("list", "--sweep", "ada-sweep", env=env)
    assert listed.returncode == 0 and "ada-sweep-2" in listed.stdout, listed.stderr
    search = tmp_path / "search.yaml"
    search.write_text(json.dumps({"space": {"optimizer.lr": {"loguniform": [1e-3, 1e-1]}}, "sampler": "random",
                                  "seed": 1, "trials": 2}))
    searched = run_baton("sweep", str(waiting), "--search", str(search), "--code", str(project), "--id", "ada-search",
                         env=env)
    assert searched.returncode == 0 and "2 trials queued" in searched.stdout, searched.stderr
    shown = run_baton("sweep-status", "ada-search", "--report", str(tmp_path / "report"), env=env)
    assert shown.returncode == 0 and "ada-search" in shown.stdout and (tmp_path / "report" / "report.md").exists()
    queue = run_baton("queue", "-Q", "nobody-serves", env=bob)
    assert queue.returncode == 0 and "ada-sweep-1" in queue.stdout and " ada " in queue.stdout, queue.stdout

    # another team's member reads and cancels none of it; its owner cancels all of it
    for args in (("sweep-cancel", "ada-sweep"), ("sweep-status", "ada-search"), ("list", "--sweep", "ada-sweep")):
        refused = run_baton(*args, env=bob)
        assert refused.returncode == 1 and "refused (403)" in refused.stderr, (args, refused.stderr)
    assert cluster.client.job("ada-sweep-1").status().state.value == "queued"
    priority = write_spec(tmp_path, {**WAITING, "resources": {"team": "nlp", "queue": "nobody-serves"}}, "nlp.yaml")
    other = run_baton("sweep", str(priority), "--grid", "seed=1,2", env=env)
    assert other.returncode == 2 and "resources.team: ada may not submit to team nlp" in other.stderr, other.stderr
    for sweep_id in ("ada-sweep", "ada-search"):
        assert run_baton("sweep-cancel", sweep_id, env=env).returncode == 0
    assert cluster.client.job("ada-sweep-2").status().state.value == "cancelled"

    # the pool's settings: an admin's, through the same server
    refused = run_baton("quota", "set", "vision", "--slots", "1", env=env)
    assert refused.returncode == 1 and "refused (403)" in refused.stderr
    quota = run_baton("quota", "set", "vision", "--slots", "1", "-Q", "nobody-serves", env=root)
    assert quota.returncode == 0 and "no live worker serves queue 'nobody-serves'" in quota.stderr, quota.stderr
    assert "vision" in run_baton("quota", "list", env=root).stdout
    assert run_baton("quota", "rm", "vision", "-Q", "nobody-serves", env=root).returncode == 0
    missing = run_baton("drain", "nobody@nowhere", env=root)
    assert missing.returncode == 2 and "nobody@nowhere" in missing.stderr, missing.stderr


@pytest.mark.slow
def test_logs_followed_through_the_server_are_the_whole_log_and_one_attempts_is_its_own(cluster, pool, tmp_path):  # noqa: F811
    """A log chunk grows while its attempt runs: a follower through the server reads it again, not past it."""
    import subprocess

    from tests.helpers import BATON
    from tests.workers.tracking.test_job_logs import SPEC as CHATTY

    server, tokens = pool
    cluster.start_workers(1)
    env = _user_env(server, tokens["ada"], tmp_path)
    spec = write_spec(tmp_path, {**CHATTY, "resources": {"team": "vision"}})
    assert run_baton("submit", str(spec), "--id", "ada-chatty", env=env).returncode == 0
    follower = subprocess.Popen([*BATON, "logs", "ada-chatty", "-f"], env=env, cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    followed, errors = follower.communicate(timeout=180)
    assert follower.returncode == 0, errors
    whole = run_baton("logs", "ada-chatty", env=env).stdout
    assert followed == whole and whole.count("\n") > 30, (len(followed), len(whole))
    assert whole == cluster.client.job("ada-chatty").logs()
    one = run_baton("logs", "ada-chatty", "--attempt", "1", env=env)
    assert one.returncode == 0 and one.stdout == cluster.client.job("ada-chatty").logs(attempt=1), one.stderr
