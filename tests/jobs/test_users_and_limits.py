"""The pool's users and team limits from the command line (direct mode: the operator, who holds the Redis
URL), a team's max priority refusing a job at submit and at a priority change, and ``submitted_by``."""
from __future__ import annotations

import pytest
import redis as redis_lib

from baton.schemas.errors import OverLimit
from baton.schemas.principals import Principal, Role
from baton.storage.records.principals import Principals
from tests.helpers import make_spec, run_baton, write_spec


def member(name: str, *teams: str) -> Principal:
    return Principal(name=name, role=Role.member, teams=teams)


def test_users_are_added_listed_rotated_and_removed_and_each_mistake_is_one_line(cluster):
    principals = Principals(redis_lib.Redis.from_url(cluster.redis_url))
    added = run_baton("users", "add", "ada", "--team", "vision", "--team", "nlp", env=cluster.env)
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert token.startswith("bt_") and "\n" not in token and "shown once" in added.stderr
    ada = principals.authenticate(token)
    assert ada is not None and ada.teams == ("vision", "nlp") and ada.role.value == "member"

    assert run_baton("users", "add", "root", "--role", "admin", "--service", env=cluster.env).returncode == 0
    listed = run_baton("users", "list", env=cluster.env)
    assert listed.returncode == 0 and token not in listed.stdout
    rows = {line.split()[0]: line.split()[1:4] for line in listed.stdout.splitlines()[1:]}
    assert rows == {"ada": ["member", "vision,nlp", "person"], "root": ["admin", "-", "service"]}

    for args, said in [(("add", "ada", "--team", "vision"), "exists already"),
                       (("add", "bob"), "needs a team"),
                       (("add", "bob", "--team", "vision", "--role", "owner"), "role"),
                       (("add", "Bob!", "--team", "vision"), "name"),
                       (("add", "bob", "--team", "no such team"), "teams"),
                       (("token", "ada"), "--rotate")]:
        done = run_baton("users", *args, env=cluster.env)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {p.name for p in principals.list()} == {"ada", "root"}  # nothing half-made

    rotated = run_baton("users", "token", "ada", "--rotate", env=cluster.env)
    assert rotated.returncode == 0
    assert principals.authenticate(token) is None and principals.authenticate(rotated.stdout.strip()).name == "ada"
    assert run_baton("users", "rm", "ada", env=cluster.env).returncode == 0
    assert principals.authenticate(rotated.stdout.strip()) is None
    gone = run_baton("users", "rm", "ada", env=cluster.env)
    assert gone.returncode == 1 and "no user ada" in gone.stderr


def test_a_team_s_max_priority_refuses_a_job_above_it_at_submit_and_later(cluster, tmp_path):
    set_ = run_baton("teams", "set", "vision", "--max-priority", "10", env=cluster.env)
    assert set_.returncode == 0 and "max priority 10" in set_.stdout
    assert run_baton("teams", "list", env=cluster.env).stdout.strip() == "vision: max priority 10"

    high = write_spec(tmp_path, make_spec(resources={"team": "vision", "priority": 11}), "high.yaml")
    refused = run_baton("submit", str(high), env=cluster.env)
    assert refused.returncode == 2
    assert "priority 11 is above team vision's max priority 10" in refused.stderr
    assert cluster.client.list() == []  # nothing queued
    other_team = write_spec(tmp_path, make_spec(resources={"team": "nlp", "priority": 11}), "nlp.yaml")
    assert run_baton("submit", str(other_team), env=cluster.env).returncode == 0  # another team has no limit

    at = write_spec(tmp_path, make_spec(resources={"team": "vision", "priority": 10}), "at.yaml")
    submitted = run_baton("submit", str(at), env=cluster.env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[0]
    raised = run_baton("priority", job_id, "11", env=cluster.env)
    assert raised.returncode == 1 and "above team vision's max priority 10" in raised.stderr
    assert cluster.client.job(job_id).status().priority == 10
    assert run_baton("priority", job_id, "-5", env=cluster.env).returncode == 0

    sweep = run_baton("sweep", str(high), "--grid", "seed=1,2", env=cluster.env)  # every point is checked
    assert sweep.returncode == 2 and "max priority 10" in sweep.stderr
    assert run_baton("teams", "set", "vision", "--no-max-priority", env=cluster.env).returncode == 0
    assert run_baton("submit", str(high), env=cluster.env).returncode == 0
    bad = run_baton("teams", "set", "vision", env=cluster.env)
    assert bad.returncode == 2 and "--max-priority" in bad.stderr


def test_a_job_records_who_the_server_submitted_it_for_and_a_direct_one_names_nobody(cluster, tmp_path):
    spec = make_spec(resources={"team": "vision"})
    direct = cluster.client.submit(spec)
    theirs = cluster.client.acting_for(member("ada", "vision")).submit(spec)
    assert direct.status().submitted_by is None and theirs.status().submitted_by == "ada"
    assert cluster.client.submit(spec).status().submitted_by is None  # the client acting for ada is a copy

    sweep = cluster.client.acting_for(member("ada", "vision")).sweep(spec, {"seed": [1, 2]})
    assert [job.status().submitted_by for job in sweep.jobs] == ["ada", "ada"]
    search = {"space": {"optimizer.lr": {"loguniform": [1e-3, 1e-1]}}, "sampler": "random", "seed": 1, "trials": 2}
    trials = cluster.client.acting_for(member("bob", "vision")).search(spec, search)
    assert trials.jobs and [job.status().submitted_by for job in trials.jobs] == ["bob"] * len(trials.jobs)

    stranger = cluster.client.acting_for(member("eve", "nlp"))
    for attempt in (lambda: stranger.submit(spec), lambda: stranger.sweep(spec, {"seed": [1, 2]}),
                    lambda: stranger.search(spec, search, search_id="eve-search")):
        with pytest.raises(OverLimit, match="resources.team: eve may not submit to team vision"):
            attempt()
    assert not cluster.client.records.sweep_taken("eve-search")
    with pytest.raises(OverLimit, match="team vision"):  # every point's team: one of them is refused, none queued
        stranger.sweep(spec, {"resources.team": ["nlp", "vision"]}, sweep_id="eve-sweep")
    assert not cluster.client.records.sweep_ids("eve-sweep") and not cluster.client.records.exists("eve-sweep-1")

    (view,) = cluster.client.queue()
    by = {w.job_id: w.submitted_by for w in view.state.waiting}
    assert by[direct.id] == "" and by[theirs.id] == "ada"
    shown = run_baton("status", theirs.id, env=cluster.env)
    assert "submitted by: ada" in " ".join(shown.stdout.split())
    queue = run_baton("queue", env=cluster.env).stdout
    assert any(theirs.id in line and " ada " in line for line in queue.splitlines())
