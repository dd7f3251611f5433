"""The pool's principals in a real Redis: a token printed once and stored only as its digest, refused
once rotated or removed; and the role table the server reads."""
from __future__ import annotations

import pytest
import redis as redis_lib

from baton.jobs import roles
from baton.schemas.principals import Principal, Role
from baton.storage.records.principals import PrincipalError, Principals


@pytest.fixture
def principals(redis_server):
    r = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    r.flushdb()
    return Principals(r)


def everything_in(r: redis_lib.Redis) -> str:
    """Every key and value Redis holds, as one text."""
    out = []
    for key in r.scan_iter():
        kind = r.type(key)
        value = r.hgetall(key) if kind == "hash" else r.get(key) if kind == "string" else r.dump(key)
        out.append(f"{key} {value}")
    return "\n".join(out)


def test_a_token_is_given_once_stored_only_as_its_digest_and_proves_who_holds_it(principals):
    ada = Principal(name="ada", role=Role.member, teams=("vision",))
    token = principals.add(ada)
    assert token.startswith("bt_") and len(token) >= 40
    assert token not in everything_in(principals.redis)  # not the token, nor
    assert token[3:] not in everything_in(principals.redis)  # its random part
    found = principals.authenticate(token)
    assert found is not None and (found.name, found.role, found.teams) == ("ada", Role.member, ("vision",))
    assert found.created_at > 0
    for stranger in ("", "bt_", token[:-1], token + "x", token[3:], "Bearer " + token, "bt_" + "A" * 200,
                     token[:-1] + "\udc80", None, b"bt_x", 42, token + "\n"):
        assert principals.authenticate(stranger) is None, stranger
    with pytest.raises(PrincipalError, match="user ada exists already"):
        principals.add(Principal(name="ada", role=Role.admin))
    assert principals.authenticate(token).role is Role.member  # the refused add changed nothing


def test_a_rotated_token_is_refused_and_the_new_one_proves_the_same_principal(principals):
    old = principals.add(Principal(name="ci", role=Role.member, teams=("nlp",), service=True))
    new = principals.rotate("ci")
    assert new != old
    assert principals.authenticate(old) is None
    found = principals.authenticate(new)
    assert found is not None and found.name == "ci" and found.service
    with pytest.raises(PrincipalError, match="no user nobody"):
        principals.rotate("nobody")
    # an index entry a rotation left behind (written back by hand) proves nothing: the record says which is current
    from baton.storage.records import keys
    from baton.storage.records.principals import digest

    principals.redis.hset(keys.TOKENS, digest(old), "ci")
    assert principals.authenticate(old) is None and principals.authenticate(new).name == "ci"


def test_rotations_racing_on_one_principal_leave_exactly_one_token_that_works(principals, redis_server):
    """Two clients rotating the same principal at once: each call retries its transaction when the other
    changed the record meanwhile, none fails, and only the last token written proves anything."""
    import threading

    first = principals.add(Principal(name="ci", role=Role.member, teams=("nlp",)))
    tokens: list[str] = [first]
    errors: list[BaseException] = []

    def rotate_often():
        mine = Principals(redis_lib.Redis.from_url(redis_server.url, decode_responses=True))
        try:
            for _ in range(40):
                tokens.append(mine.rotate("ci"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rotate_often) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    working = [t for t in tokens if principals.authenticate(t) is not None]
    assert len(tokens) == 81 and len(working) == 1, working
    assert principals.redis.hlen("baton:tokens") == 1  # no digest left behind


def test_a_name_removed_and_added_again_refuses_the_old_token(principals):
    old = principals.add(Principal(name="sam", role=Role.admin))
    principals.remove("sam")
    new = principals.add(Principal(name="sam", role=Role.member, teams=("a",)))
    assert principals.authenticate(old) is None
    assert principals.authenticate(new).role is Role.member
    assert [p.name for p in principals.list()] == ["sam"]


def test_a_removed_principal_is_refused_and_listed_no_more(principals):
    keep = principals.add(Principal(name="bob", role=Role.lead, teams=("a", "b")))
    gone = principals.add(Principal(name="eve", role=Role.admin))
    assert [p.name for p in principals.list()] == ["bob", "eve"]
    principals.remove("eve")
    assert principals.authenticate(gone) is None
    assert principals.get("eve") is None
    assert [p.name for p in principals.list()] == ["bob"]
    assert principals.authenticate(keep).name == "bob"
    with pytest.raises(PrincipalError, match="no user eve"):
        principals.remove("eve")


def test_a_principals_name_and_teams_are_checked(principals):
    for name in ("Ada", "ada:x", "ada\n", "*", ""):
        with pytest.raises(PrincipalError, match="is not a user's name"):
            principals.rotate(name)
        with pytest.raises(PrincipalError, match="is not a user's name"):
            principals.get(name)
    with pytest.raises(ValueError):
        Principal(name="Ada Lovelace", role=Role.member)
    with pytest.raises(ValueError):
        Principal(name="ada", role=Role.member, teams=("no spaces",))
    with pytest.raises(ValueError):
        Principal(name="ada", role="owner")


MEMBER = Principal(name="mia", role=Role.member, teams=("vision",))
LEAD = Principal(name="leo", role=Role.lead, teams=("vision", "audio"))
ADMIN = Principal(name="ann", role=Role.admin)


@pytest.mark.parametrize("who, team, allowed", [
    (MEMBER, "vision", True), (MEMBER, "nlp", False), (LEAD, "audio", True), (LEAD, "nlp", False), (ADMIN, "nlp", True)])
def test_submitting_and_reading_go_by_team(who, team, allowed):
    assert (roles.may_submit(who, team) is None) == allowed
    assert (roles.may_read(who, team) is None) == allowed


@pytest.mark.parametrize("action", sorted(roles.JOB_ACTIONS))
def test_a_member_acts_on_their_own_jobs_a_lead_on_their_teams_an_admin_on_all(action):
    assert roles.may_act(MEMBER, action, "vision", "mia") is None
    refused = roles.may_act(MEMBER, action, "vision", "leo")
    assert refused == f"mia may {action} only their own jobs (this one is leo's); a lead of vision may"
    assert roles.may_act(MEMBER, action, "nlp", "mia") == f"mia may not {action} team nlp's jobs"  # (left the team)
    assert roles.may_act(LEAD, action, "vision", "mia") is None
    assert roles.may_act(LEAD, action, "nlp", "someone") == f"leo may not {action} team nlp's jobs"
    assert roles.may_act(ADMIN, action, "nlp", "someone") is None


def test_an_action_the_table_does_not_know_is_an_error_not_allowed():
    with pytest.raises(ValueError, match="'delete' is not an action on a job"):
        roles.may_act(ADMIN, "delete", "vision", "ann")
    with pytest.raises(ValueError, match="'reboot' is not an action on the pool"):
        roles.may_run_pool(ADMIN, "reboot")


@pytest.mark.parametrize("action", sorted(roles.POOL_ACTIONS))
def test_only_an_admin_runs_the_pool(action):
    assert roles.may_run_pool(MEMBER, action) == f"{action} needs the admin role (mia is a member)"
    assert roles.may_run_pool(LEAD, action) == f"{action} needs the admin role (leo is a lead)"
    assert roles.may_run_pool(ADMIN, action) is None


def test_a_priority_above_the_teams_limit_is_refused_naming_it():
    assert roles.within_limit(10, "vision", None) is None
    assert roles.within_limit(10, "vision", 10) is None
    assert roles.within_limit(11, "vision", 10) == "priority 11 is above team vision's max priority 10"
