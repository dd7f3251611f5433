"""What each role may do: one table, read by the server before it acts (pure: no I/O).

- **member**: submits to its teams; cancels, resumes and changes the priority of the jobs it submitted;
  reads every job of its teams.
- **lead**: the same for every job of its teams.
- **admin**: everything, and alone the pool's settings: quotas, team limits, drain and undrain, users,
  the audit trail.

Nobody reads another team's jobs but an admin: a job's spec, metrics and logs are its team's work
(Determined's workspaces and Kubernetes' namespaces draw the same line). A job's priority may not exceed
its team's ``max_priority`` (``baton teams set``), whoever asks: an admin raises the limit first.

Each check answers None (allowed) or the one line that says why not.
"""
from __future__ import annotations

from typing import Optional

from baton.schemas.principals import Principal, Role

POOL_ACTIONS = frozenset({"quota", "teams", "drain", "users", "audit"})
"""What only an admin does."""
JOB_ACTIONS = frozenset({"cancel", "resume", "priority"})


def _of_team(who: Principal, team: str) -> bool:
    return who.role is Role.admin or who.in_team(team)


def may_submit(who: Principal, team: str) -> Optional[str]:
    if _of_team(who, team):
        return None
    return f"{who.name} may not submit to team {team} (their teams: {', '.join(who.teams) or 'none'})"


def may_read(who: Principal, team: str) -> Optional[str]:
    return None if _of_team(who, team) else f"{who.name} may not read team {team}'s jobs"


def may_act(who: Principal, action: str, team: str, submitted_by: str) -> Optional[str]:
    """``action`` (cancel, resume, priority) on a job of ``team`` that ``submitted_by`` submitted."""
    if action not in JOB_ACTIONS:
        raise ValueError(f"{action!r} is not an action on a job ({', '.join(sorted(JOB_ACTIONS))})")
    if who.role is Role.admin:
        return None
    if not who.in_team(team):
        return f"{who.name} may not {action} team {team}'s jobs"
    if who.role is Role.lead or submitted_by == who.name:
        return None
    return f"{who.name} may {action} only their own jobs (this one is {submitted_by or 'nobody'}'s); a lead of {team} may"


def may_run_pool(who: Principal, action: str) -> Optional[str]:
    """``action``: one of POOL_ACTIONS."""
    if action not in POOL_ACTIONS:
        raise ValueError(f"{action!r} is not an action on the pool ({', '.join(sorted(POOL_ACTIONS))})")
    return None if who.role is Role.admin else f"{action} needs the admin role ({who.name} is a {who.role.value})"


def within_limit(priority: int, team: str, max_priority: Optional[int]) -> Optional[str]:
    """A job of ``team`` at ``priority``, where the team's limit is ``max_priority`` (None: no limit)."""
    if max_priority is None or priority <= max_priority:
        return None
    return f"priority {priority} is above team {team}'s max priority {max_priority}"
