"""The pool's server (``baton server``) over a real Redis, S3 and worker, tried by strangers and by users of
each role over plain HTTP and in a real browser: no token or a wrong one is 401, a member acting on another
team's job or on the pool is 403 and changes nothing, a job above its team's max priority is refused, an
admin's pool actions are done, every action and refusal is in the audit trail (Redis and the store), and a
token rotated through one server is refused by another at once."""
from __future__ import annotations

import json
import time

import pytest
import redis as redis_lib

from baton.schemas.principals import Principal, Role
from tests.dashboard.conftest import start_server, stop, wait_for
from tests.helpers import make_spec, run_baton

WAITING = make_spec(resources={"queue": "nobody-serves", "team": "vision"})
ADA, BOB = Principal(name="ada", role=Role.member, teams=("vision",)), Principal(name="bob", role=Role.member, teams=("nlp",))
LONG = make_spec(loop={"epochs": 400}, checkpoint={"every_steps": 200, "min_interval_s": 1},
                 resources={"team": "vision"})


def _user(cluster, name: str, *args: str) -> str:
    done = run_baton("users", "add", name, *args, env=cluster.env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def pool(cluster):
    """A server, and the tokens of: an admin, two members of vision, a lead of vision, a member of nlp."""
    tokens = {"root": _user(cluster, "root", "--role", "admin"), "ada": _user(cluster, "ada", "--team", "vision"),
              "ann": _user(cluster, "ann", "--team", "vision"), "lea": _user(cluster, "lea", "--team", "vision",
                                                                           "--role", "lead"),
              "bob": _user(cluster, "bob", "--team", "nlp")}
    server = start_server(cluster.env, cluster.log_dir / "server.log")
    yield server, tokens
    stop(server.proc)


ROUTES = [("GET", "/api/jobs", None), ("GET", "/api/jobs/x", None), ("GET", "/api/jobs/x/status", None),
          ("GET", "/api/jobs/x/log", None), ("GET", "/api/jobs/x/metrics", None), ("GET", "/api/jobs/x/events", None),
          ("GET", "/api/jobs/x/artifacts/best", None), ("GET", "/api/queue", None), ("GET", "/api/workers", None),
          ("GET", "/api/info", None), ("GET", "/api/whoami", None), ("GET", "/api/users", None),
          ("GET", "/api/audit", None), ("GET", "/api/teams", None), ("POST", "/api/jobs", {"spec": WAITING}),
          ("POST", "/api/jobs/x/cancel", None), ("POST", "/api/jobs/x/resume", None),
          ("POST", "/api/jobs/x/priority", {"priority": 1}), ("POST", "/api/workers/w/drain", None),
          ("PUT", "/api/quotas/default/vision", {"slots": 1}), ("DELETE", "/api/quotas/default/vision", None),
          ("PUT", "/api/teams/vision", {"max_priority": 1}), ("POST", "/api/users", {"name": "eve", "role": "admin"}),
          ("DELETE", "/api/users/root", None), ("POST", "/api/users/root/token", None),
          ("GET", "/api/openapi.json", None)]


def test_a_stranger_reaches_nothing_but_the_health_check(cluster, pool):
    server, tokens = pool
    job = cluster.client.acting_for(ADA).submit(WAITING, "held")
    for method, path, body in ROUTES:
        for token, headers in ((None, {}), ("bt_" + "x" * 43, {}), (tokens["ada"][:-1], {}), ("", {}),
                               (None, {"Cookie": f"batonToken={tokens['root']}; session={tokens['root']}"}),
                               (None, {"Authorization": f"Basic {tokens['root']}"})):
            status, answer = server.call(method, path.replace("/x", "/held"), body, token=token, headers=headers)
            expected = 404 if path == "/api/openapi.json" else 401  # (no schema to map the API by)
            assert status == expected, (method, path, token, headers, status, answer)
    status, answer = server.call("POST", "/api/jobs/held/cancel", token=tokens["ada"],
                                 headers={"Origin": "http://evil.example"})
    assert status == 403 and "another site" in answer["detail"]
    status, answer = server.call("GET", "/api/jobs", token=tokens["root"], headers={"Host": "evil.example"})
    assert status == 421
    assert server.call("GET", "/api/health") == (200, {"ok": True})
    deep = server.call("POST", "/api/jobs/held/priority", None, token=tokens["root"],
                       headers={"Content-Type": "application/json"}, data=b"[" * 4000)
    assert deep[0] == 422, deep  # (not a 500 that escapes the audit trail)
    assert job.status().state.value == "queued" and job.status().priority == 0
    assert {p.name for p in _principals(cluster).list()} == set(tokens)
    log = server.log.read_text()
    assert not any(token in log for token in tokens.values())  # (the server printed no token it was shown)


def _principals(cluster):
    from baton.storage.records.principals import Principals

    return Principals(redis_lib.Redis.from_url(cluster.redis_url))


def test_each_role_does_what_it_may_and_every_action_is_audited(cluster, pool):
    server, tokens = pool
    cluster.start_workers(1)
    status, answer = server.call("POST", "/api/jobs", {"spec": LONG, "id": "ada-long"}, token=tokens["ada"])
    assert status == 200 and answer == {"id": "ada-long"}, answer
    job = cluster.client.job("ada-long")
    assert job.status().submitted_by == "ada"
    wait_for(lambda: (job.status().step or 0) > 0, 120, "ada's job to train")

    # bob (nlp) cannot touch or read vision's job, and it keeps training
    for method, path, body in (("POST", "/api/jobs/ada-long/cancel", None), ("GET", "/api/jobs/ada-long", None),
                               ("POST", "/api/jobs/ada-long/priority", {"priority": 3}),
                               ("GET", "/api/jobs/ada-long/status", None), ("GET", "/api/jobs/ada-long/log", None)):
        status, answer = server.call(method, path, body, token=tokens["bob"])
        assert status == 403 and "bob" in answer["detail"], (path, status, answer)
    assert [row["id"] for row in server.call("GET", "/api/jobs", token=tokens["bob"])[1]["jobs"]] == []
    assert [row["id"] for row in server.call("GET", "/api/jobs", token=tokens["ann"])[1]["jobs"]] == ["ada-long"]
    # ann (vision, member) may read it but not act on it; lea (vision, lead) may
    assert server.call("GET", "/api/jobs/ada-long/status", token=tokens["ann"])[1]["submitted_by"] == "ada"
    status, answer = server.call("POST", "/api/jobs/ada-long/cancel", token=tokens["ann"],
                                 headers={"X-Forwarded-For": "6.6.6.6"})
    assert status == 403 and "only their own jobs" in answer["detail"], answer
    step = job.status().step
    wait_for(lambda: job.status().step > step, 60, "the job to go on training")
    assert job.status().state.value == "running"
    assert server.call("POST", "/api/jobs/ada-long/priority", {"priority": 4}, token=tokens["lea"])[0] == 200

    # the pool's settings are the admin's
    for who in ("ada", "lea"):
        for method, path, body in (("PUT", "/api/quotas/default/vision", {"slots": 1}),
                                   ("PUT", "/api/teams/vision", {"max_priority": 9}), ("GET", "/api/users", None),
                                   ("GET", "/api/audit", None), ("POST", "/api/workers/w0/drain", None),
                                   ("POST", "/api/users", {"name": "eve", "role": "admin"})):
            status, answer = server.call(method, path, body, token=tokens[who])
            assert status == 403 and "admin" in answer["detail"], (who, path, status, answer)
    assert cluster.client.quotas() == {} and _principals(cluster).get("eve") is None
    assert server.call("PUT", "/api/quotas/default/vision", {"slots": 1}, token=tokens["root"])[0] == 200
    assert cluster.client.quotas() == {"default": {"vision": 1}}
    assert server.call("PUT", "/api/teams/vision", {"max_priority": 5}, token=tokens["root"])[0] == 200

    # above the team's max priority: refused, whoever asks, at submit and later
    high = {**WAITING, "resources": {**WAITING["resources"], "priority": 6}}
    status, answer = server.call("POST", "/api/jobs", {"spec": high}, token=tokens["ada"])
    assert status == 403 and answer["detail"]["problems"] == [
        "resources.priority: priority 6 is above team vision's max priority 5"], answer
    status, answer = server.call("POST", "/api/jobs/ada-long/priority", {"priority": 6}, token=tokens["root"])
    assert status == 403 and "max priority 5" in answer["detail"], answer
    assert job.status().priority == 4
    # a member submits only to its teams; a spec naming none is its team's
    status, answer = server.call("POST", "/api/jobs", {"spec": WAITING}, token=tokens["bob"])
    assert status == 403 and "may not submit to team vision" in answer["detail"]["message"], answer
    status, answer = server.call("POST", "/api/jobs", {"spec": make_spec(resources={"queue": "nobody-serves"})},
                                 token=tokens["bob"])
    assert status == 200 and cluster.client.job(answer["id"]).status().team == "nlp", answer
    # nor may anyone make the server read its own files
    for spec in ("/etc/passwd", make_spec(code={"dir": "/etc"})):
        status, answer = server.call("POST", "/api/jobs", {"spec": spec}, token=tokens["root"])
        assert status == 422, (spec, answer)
    status, _ = server.call("POST", "/api/jobs", {"spec": WAITING, "overrides": ["code.dir=/etc"]}, token=tokens["ada"])
    assert status == 422
    for grid in ({"code.dir": ["/etc"]}, {"code": [{"dir": "/etc"}]}):  # nor through a sweep's grid, nor a search's space
        status, answer = server.call("POST", "/api/sweeps", {"spec": WAITING, "grid": grid, "id": "etc"}, token=tokens["root"])
        assert status == 422 and "through the pool's server" in str(answer) and "not a directory" not in str(answer), answer
    assert not cluster.client.records.sweep_ids("etc") and not cluster.store().exists("jobs/etc-1/spec.json")
    status, answer = server.call("POST", "/api/searches", {"spec": WAITING, "id": "etc", "search": {
        "space": {"code.dir": {"choice": ["/etc"]}}, "sampler": "grid"}}, token=tokens["ada"])
    assert status == 422 and "cannot search a trial's code" in str(answer), answer
    # a grid too large to make, NaN, a lone surrogate: refused in one line, each in the audit trail
    huge = {"seed": list(range(1000)), "optimizer.lr": [0.1] * 1000}
    status, answer = server.call("POST", "/api/sweeps", {"spec": WAITING, "grid": huge}, token=tokens["ada"])
    assert status == 422 and "1,000,000 points" in answer["detail"]["problems"][0], answer
    for raw in (b'{"spec": {"name": "t", "seed": NaN}}', b'{"spec": {"name": "t"}, "id": "\\ud800"}'):
        status, answer = server.call("POST", "/api/jobs", None, token=tokens["ada"], data=raw)
        assert status == 422, (raw, status, answer)

    assert server.call("POST", "/api/jobs/ada-long/cancel", token=tokens["ada"])[1]["result"] == "requested"
    wait_for(lambda: job.status().state.value == "cancelled", 60, "ada's own cancel")
    assert server.call("GET", "/api/jobs/nosuch/status", token=tokens["ada"])[0] == 404
    server.call("GET", "/api/jobs")  # a stranger's read: refused, audited

    status, answer = server.call("GET", "/api/audit", token=tokens["root"])
    assert status == 200
    entries = [(e["principal"], e["action"], e["target"], e["result"]) for e in answer["entries"]]
    for expected in [("ada", "submit", "ada-long", "allowed"), ("bob", "cancel", "ada-long", "refused"),
                     ("ann", "cancel", "ada-long", "refused"), ("lea", "priority", "ada-long", "allowed"),
                     ("ada", "quota.set", "default/vision", "refused"), ("root", "quota.set", "default/vision", "allowed"),
                     ("ada", "submit", f"name={WAITING['name']}", "refused"), ("root", "priority", "ada-long", "refused"),
                     ("bob", "read", "ada-long", "refused"), ("ada", "cancel", "ada-long", "allowed"),
                     (None, "list", "", "refused")]:
        assert expected in entries, (expected, entries)
    refused = next(e for e in answer["entries"] if e["principal"] == "bob" and e["action"] == "cancel")
    assert "may not cancel team vision's jobs" in refused["reason"] and refused["client"] == "127.0.0.1"
    over = next(e for e in answer["entries"] if e["principal"] == "ada" and e["action"] == "submit" and e["result"] == "refused")
    assert over["reason"] == "resources.priority: priority 6 is above team vision's max priority 5", over  # (one line)
    forged = next(e for e in answer["entries"] if e["principal"] == "ann" and e["action"] == "cancel")
    assert forged["client"] == "127.0.0.1"  # (its X-Forwarded-For is nobody's word)
    assert server.call("GET", "/api/audit?user=bob", token=tokens["root"])[1]["entries"][0]["principal"] == "bob"
    audit_cli = run_baton("audit", "--user", "bob", "--since", "1h", env=cluster.env)
    assert audit_cli.returncode == 0 and "bob cancel ada-long refused" in audit_cli.stdout, audit_cli.stderr

    stop(server.proc)  # the store's copy: every entry, flushed at the latest when the server stops
    store = cluster.store()
    stored = [json.loads(line) for key in store.list("audit/") for line in store.get_bytes(key).decode().splitlines()]
    assert sorted(map(json.dumps, stored)) == sorted(map(json.dumps, answer["entries"]))  # (reads since: not written)


@pytest.mark.slow
def test_the_dashboard_signs_in_with_a_token_and_shows_only_the_user_s_teams(cluster, pool, browser):
    server, tokens = pool
    cluster.client.acting_for(ADA).submit(WAITING, "adas")
    cluster.client.acting_for(BOB).submit(make_spec(resources={"queue": "nobody-serves", "team": "nlp"}), "bobs")
    browser.get(server.url + "/")
    said = wait_for(lambda: browser.find_element("id", "banner").text, 30, "the page to say it needs a token")
    assert "sign in" in said and browser.execute_script("return document.querySelectorAll('#jobs tbody tr').length") == 0
    browser.find_element("id", "token").send_keys(tokens["ada"] + "\n")
    rows = wait_for(lambda: browser.execute_script(
        "return [...document.querySelectorAll('#jobs tbody tr')].map((r) => r.dataset.id)"), 30, "ada's jobs")
    assert rows == ["adas"], rows
    assert "ada" in browser.execute_script("return document.querySelector('#jobs tbody tr').innerText")
    browser.get(server.url + "/jobs/bobs")  # (the token stays in this tab)
    said = wait_for(lambda: browser.execute_script("return document.body.innerText.includes('may not read') && "
                                                   "document.body.innerText"), 30, "the refusal")
    assert "nlp" in said
    assert browser.get_cookies() == []  # the token is never a cookie

    # the audit trail's page: an admin's alone
    browser.get(server.url + "/audit")
    said = wait_for(lambda: browser.find_element("id", "banner").text, 30, "the page to refuse a member")
    assert "needs the admin role" in said, said
    token = browser.find_element("id", "token")
    token.clear()
    token.send_keys(tokens["root"] + "\n")
    rows = wait_for(lambda: browser.execute_script(
        "return [...document.querySelectorAll('#audit tbody tr')].map((r) => r.innerText)"), 30, "the trail")
    assert any("ada" in row and "bobs" in row and "refused" in row and "may not read" in row for row in rows), rows
