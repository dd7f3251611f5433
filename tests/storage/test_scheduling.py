"""The scheduler's decisions (which running job yields to which waiting one), on queue states built by
hand; tests/workers/queue/test_preemption.py has them carried out by real workers."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from baton.storage.records.pool import QueueState, Running, Waiting, _merge
from baton.storage.records.refusals import Placement
from baton.storage.records.scheduling import decide, plan


def waiting(job_id: str, priority: int = 0, team: str = "default", slots: int = 1, at: float = 0.0) -> Waiting:
    return Waiting(job_id, job_id, team, priority, at, 1, slots)


def queue(running: list[Running], waits: list[Waiting], quotas: dict[str, int] | None = None) -> QueueState:
    usage: dict[str, int] = {}
    for job in running:
        usage[job.team] = usage.get(job.team, 0) + job.slots
    lines: dict[str, list[Waiting]] = {}
    for job in sorted(waits, key=lambda w: (-w.priority, w.submitted_at)):
        lines.setdefault(job.team, []).append(job)
    return QueueState("q", _merge(lines, dict(usage), quotas or {}), running, usage, quotas or {})


def test_a_higher_priority_job_takes_the_lowest_priority_slot_and_only_one():
    state = queue([Running("low", "default", 1, 0), Running("lower", "default", 1, -5)], [waiting("urgent", 10)])
    [one] = decide(state, idle_slots=0, yielding=set())
    assert (one.job_id, one.for_job, one.reason) == ("lower", "urgent", "yielded to job urgent (priority 10)")


def test_a_job_in_its_yield_cooldown_is_passed_over_for_another():
    state = queue([Running("a-low", "default", 1, 0), Running("b-low", "default", 1, 0)], [waiting("urgent", 10)])
    [one] = decide(state, idle_slots=0, yielding=set(), cooling=frozenset({"a-low"}))
    assert one.job_id == "b-low"  # (not a-low, which the mark would refuse: nothing would yield for a minute)
    assert decide(state, idle_slots=0, yielding=set(), cooling=frozenset({"a-low", "b-low"})) == []


def test_nothing_yields_while_a_worker_is_idle_or_a_yield_is_under_way():
    running = [Running("low", "default", 1, 0), Running("low2", "default", 1, 0)]
    assert decide(queue(running, [waiting("urgent", 10)]), idle_slots=1, yielding=set()) == []
    assert decide(queue(running, [waiting("urgent", 10)]), idle_slots=0, yielding={"low2"}) == []


def test_equal_priority_never_preempts_and_neither_does_a_lower_one():
    running = [Running("a", "default", 1, 5)]
    assert decide(queue(running, [waiting("b", 5), waiting("c", 0)]), 0, set()) == []


def test_busy_at_priority_20_three_lower_jobs_wait_in_order_and_preempt_nothing():
    state = queue([Running("r1", "default", 1, 20), Running("r2", "default", 1, 20)],
                  [waiting("x1", 0, at=1), waiting("x2", 5, at=2), waiting("x3", 0, at=3)])
    assert [w.job_id for w in state.waiting] == ["x2", "x1", "x3"]
    assert decide(state, 0, set()) == []


def test_a_team_below_its_quota_reclaims_a_borrowed_slot_of_no_higher_priority():
    state = queue([Running("a1", "a", 1, 0), Running("a2", "a", 1, 3)], [waiting("b1", 0, team="b")], {"a": 1, "b": 1})
    [one] = decide(state, 0, set())
    assert (one.job_id, one.reason) == ("a1", "team a's slot reclaimed by team b")
    state = queue([Running("a1", "a", 1, 7), Running("a2", "a", 1, 3)], [waiting("b1", 5, team="b")], {"a": 1, "b": 1})
    assert decide(state, 0, set())[0].job_id == "a2"
    # a higher priority would start again first (the order is priority, then quota): nothing is reclaimed
    state = queue([Running("a1", "a", 1, 7), Running("a2", "a", 1, 3)], [waiting("b1", 0, team="b")], {"a": 1, "b": 1})
    assert decide(state, 0, set()) == []


def test_after_a_reclaim_nobody_takes_the_slot_back():
    # a1 yielded to b1: team a is at its quota, b within its own
    state = queue([Running("a2", "a", 1, 3), Running("b1", "b", 1, 0)], [waiting("a1", 0, team="a")], {"a": 1, "b": 1})
    assert decide(state, 0, set()) == []
    # however high a1's priority: b1's slot is within b's quota (a2, of equal priority, is not taken either)
    state = queue([Running("a2", "a", 1, 9), Running("b1", "b", 1, 0)], [waiting("a1", 9, team="a")], {"a": 1, "b": 1})
    assert decide(state, 0, set()) == []


def test_a_slot_within_a_teams_quota_is_not_taken_by_another_teams_priority():
    state = queue([Running("b1", "b", 1, 0)], [waiting("a1", 10, team="a")], {"b": 1})
    assert decide(state, 0, set()) == []
    # ...but a higher priority of the same team takes it
    state = queue([Running("b1", "b", 1, 0)], [waiting("b2", 10, team="b")], {"b": 1})
    assert decide(state, 0, set())[0].job_id == "b1"


def test_a_job_of_several_nodes_preempts_all_it_needs_or_nothing():
    two = [waiting("big", 10, slots=2)]
    assert decide(queue([Running("low", "default", 1, 0), Running("high", "default", 1, 50)], two), 0, set()) == []
    both = decide(queue([Running("l1", "default", 1, 0), Running("l2", "default", 1, 1)], two), 0, set())
    assert sorted(y.job_id for y in both) == ["l1", "l2"]
    one_free = decide(queue([Running("l1", "default", 1, 0), Running("l2", "default", 1, 1)], two), 1, set())
    assert [y.job_id for y in one_free] == ["l1"]


def test_two_waiting_jobs_preempt_two_running_ones():
    state = queue([Running("l1", "default", 1, 0), Running("l2", "default", 1, 0), Running("h", "default", 1, 10)],
                  [waiting("u1", 5, at=1), waiting("u2", 5, at=2)])
    assert sorted((y.job_id, y.for_job) for y in decide(state, 0, set())) == [("l1", "u1"), ("l2", "u2")]


teams = st.sampled_from(["a", "b", "c"])


@settings(max_examples=500, deadline=None)
@given(running=st.lists(st.tuples(teams, st.integers(-2, 2), st.integers(1, 2)), min_size=1, max_size=6),
       waits=st.lists(st.tuples(teams, st.integers(-2, 2), st.integers(1, 2)), min_size=1, max_size=4),
       quotas=st.dictionaries(teams, st.integers(0, 3)), idle=st.integers(0, 2))
def test_no_yield_is_undone_by_the_next_decision(running, waits, quotas, idle):
    """Carry out one turn's plan (each yielded job waits again, each job that starts runs), then decide
    again: no job that was yielded to is asked to yield to one that yielded to it (no thrash)."""
    run = [Running(f"r{i}", team, slots, priority) for i, (team, priority, slots) in enumerate(running)]
    wait = [waiting(f"w{i}", priority, team, slots, at=float(i)) for i, (team, priority, slots) in enumerate(waits)]
    first, starts = plan(queue(run, wait, quotas), idle, set())
    if not first:
        return
    gone = {y.job_id for y in first}
    placed = {y.for_job for y in first}
    freed = sum(r.slots for r in run if r.job_id in gone)
    idle -= sum(w.slots for w in wait if w.job_id in starts) - freed
    placed_now = set(starts)
    by_id = {r.job_id: r for r in run}
    now_running = [r for r in run if r.job_id not in gone] + [
        Running(w.job_id, w.team, w.slots, w.priority) for w in wait if w.job_id in placed_now]
    now_waiting = [w for w in wait if w.job_id not in placed_now] + [
        waiting(j, by_id[j].priority, by_id[j].team, by_id[j].slots, at=-1.0) for j in gone]
    assert idle >= 0
    second = decide(queue(now_running, now_waiting, quotas), idle, set())
    assert not [y for y in second if y.job_id in placed and y.for_job in gone], (first, second)


def test_at_equal_priority_the_fewest_slots_that_cover_the_need_yield():
    # a 2-node job sorts first by id; one slot is needed: the 1-node job yields, the gang trains on
    state = queue([Running("a-gang", "default", 2, 0), Running("b-single", "default", 1, 0)], [waiting("urgent", 10)])
    assert [y.job_id for y in decide(state, 0, set())] == ["b-single"]
    # three slots needed: the gang and one single, not both singles and the gang
    state = queue([Running("a-gang", "default", 2, 0), Running("b1", "default", 1, 0), Running("b2", "default", 1, 0)],
                  [waiting("big", 10, slots=3)])
    assert sorted(y.job_id for y in decide(state, 0, set())) == ["a-gang", "b1"]
    # a lower priority still goes first, whatever its size
    state = queue([Running("a-gang", "default", 2, -1), Running("b-single", "default", 1, 0)], [waiting("urgent", 10)])
    assert [y.job_id for y in decide(state, 0, set())] == ["a-gang"]


def test_the_fill_back_lets_go_only_of_jobs_as_low_as_the_last_one_taken():
    # two slots needed: the lowest (1 node, priority 0) yields, then the 2-node one of priority 1; the
    # lowest is not let go for it (the lowest first), though the 2-node job alone would cover the need
    state = queue([Running("a", "default", 1, 0), Running("b", "default", 2, 1)], [waiting("big", 10, slots=2)])
    assert sorted(y.job_id for y in decide(state, 0, set())) == ["a", "b"]
    # at equal priority the team furthest above its quota yields first, and is not let go for another team's
    # (x: 3 slots over a quota of 0; y: 2 over its 1; the priority-20 jobs are not for the taking)
    state = queue([Running("x1", "x", 1, 0), Running("xh1", "x", 1, 20), Running("xh2", "x", 1, 20),
                   Running("yg", "y", 2, 0), Running("yh", "y", 1, 20)], [waiting("big", 10, team="z", slots=2)],
                  {"x": 0, "y": 1})
    assert sorted(y.job_id for y in decide(state, 0, set())) == ["x1", "yg"]


def test_a_gang_that_frees_more_than_needed_leaves_the_rest_to_the_next_waiting_job():
    state = queue([Running("gang", "default", 2, -1), Running("single", "default", 1, 0)],
                  [waiting("u1", 10, at=1), waiting("u2", 10, at=2)])
    yields, starts = plan(state, 0, set())
    assert [y.job_id for y in yields] == ["gang"] and starts == ["u1", "u2"]  # (not the single too)
    # ...unless the gang's worker said it cannot host that job: then the single yields for it
    placement = Placement(frozenset({"g", "s"}), {"gang": "g", "single": "s"}, {"u2": frozenset({"g"})})
    yields, starts = plan(state, 0, set(), placement=placement)
    assert [(y.job_id, y.for_job) for y in yields] == [("gang", "u1"), ("single", "u2")] and starts == ["u1", "u2"]


def test_a_priority_preemption_is_named_as_one_where_a_quota_reclaim_would_also_free_the_slot():
    state = queue([Running("v1", "vision", 1, 0)], [waiting("n1", 10, team="nlp")], {"nlp": 1})
    [one] = decide(state, 0, set())
    assert (one.job_id, one.kind, one.reason) == ("v1", "priority", "yielded to job n1 (priority 10)")
    state = queue([Running("v1", "vision", 1, 0)], [waiting("n1", 0, team="nlp")], {"nlp": 1})
    [one] = decide(state, 0, set())  # of equal priority: a reclaim it is
    assert (one.job_id, one.kind, one.reason) == ("v1", "reclaim", "team vision's slot reclaimed by team nlp")
