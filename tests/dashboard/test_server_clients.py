"""A user whose environment holds only BATON_SERVER_URL and a token (no Redis URL, no store, no AWS
variables) submits, follows, reads, fetches and acts on jobs through a real ``baton server``, from the
command line and from ``JobClient()``; a refusal is one line and an exit code."""
from __future__ import annotations

import os

import torch
from safetensors.torch import load_file

from tests.dashboard.test_server_roles import WAITING, pool  # noqa: F401 - the server and its users' tokens
from tests.helpers import REPO, make_spec, run_baton, write_spec


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
    unsupported = run_baton("queue", env=ada)
    assert unsupported.returncode == 1 and "not supported through the pool's server" in unsupported.stderr


def _principals_of(cluster):
    from tests.dashboard.test_server_roles import _principals

    return _principals(cluster)
