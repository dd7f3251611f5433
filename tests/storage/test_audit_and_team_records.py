"""The audit trail's part in Redis (bounded, newest first, filtered by time and principal) and the
teams' priority limits, in a real Redis."""
from __future__ import annotations

import pytest
import redis as redis_lib

from baton.jobs import roles
from baton.schemas.audit import AuditEntry
from baton.storage.records import audit, teams


@pytest.fixture
def r(redis_server):
    client = redis_lib.Redis.from_url(redis_server.url, decode_responses=True)
    client.flushdb()
    return client


def entry(at: float, who: str | None, result: str = "allowed", **more) -> AuditEntry:
    return AuditEntry(at=at, principal=who, action=more.pop("action", "cancel"), target=more.pop("target", "j1"),
                      result=result, **more)


def test_the_trail_keeps_the_newest_entries_and_reads_them_by_time_and_principal(r):
    for n in range(12):
        audit.append(r, entry(1000.0 + n, "ada" if n % 2 else "bob"), keep=10)
    assert r.llen("baton:audit") == 10  # bounded: the two oldest went
    assert [e.at for e in audit.recent(r)] == [1011.0 - n for n in range(10)]
    assert [e.at for e in audit.recent(r, since=1008.0)] == [1011.0, 1010.0, 1009.0, 1008.0]
    assert [e.at for e in audit.recent(r, principal="ada", since=1005.0)] == [1011.0, 1009.0, 1007.0, 1005.0]
    assert [e.at for e in audit.recent(r, principal="ada", limit=2, batch=3)] == [1011.0, 1009.0]
    assert audit.recent(r, principal="nobody") == []


def test_an_entry_reads_as_one_line_with_who_what_and_why():
    refused = entry(0.0, "mia", "refused", reason="mia may cancel only their own jobs", client="10.0.0.7")
    assert refused.line() == ("1970-01-01 00:00:00Z mia cancel j1 refused (mia may cancel only their own jobs) "
                              "from 10.0.0.7")
    assert entry(0.0, None, "refused", action="status", target="").line() == \
        "1970-01-01 00:00:00Z - status - refused from -"
    with pytest.raises(ValueError):
        entry(0.0, "mia", "maybe")
    forged = entry(0.0, None, "refused", target="a\n1970-01-01 00:00:00Z root users.add eve allowed", reason="x\ry")
    assert "\n" not in forged.line() and "\r" not in forged.line() and "a\\n1970" in forged.line()


def test_a_teams_max_priority_is_set_read_removed_and_bounded(r):
    assert teams.max_priority(r, "vision") is None
    teams.set_max_priority(r, "vision", 10)
    teams.set_max_priority(r, "audio", -5)
    assert teams.max_priority(r, "vision") == 10 and teams.limits(r) == {"audio": -5, "vision": 10}
    assert roles.within_limit(11, "vision", teams.max_priority(r, "vision")) == \
        "priority 11 is above team vision's max priority 10"
    teams.set_max_priority(r, "vision", None)
    assert teams.max_priority(r, "vision") is None and teams.limits(r) == {"audio": -5}
    with pytest.raises(ValueError, match="within"):
        teams.set_max_priority(r, "vision", 2_000_000_000)
    assert teams.max_priority(r, "vision") is None  # nothing half-written
