"""The one table from an attempt's ending to what its worker does (``workers/queue/endings.py``)."""
from __future__ import annotations

from baton.schemas.messages import Ending
from baton.schemas.status import JobState
from baton.workers.queue.endings import ACTIONS


def test_every_ending_has_one_action_and_a_counted_loss_is_never_a_release():
    assert set(ACTIONS) == set(Ending)
    lost = {ending for ending, action in ACTIONS.items() if action.kind == "lose"}
    released = {ending for ending, action in ACTIONS.items() if action.kind == "release"}
    assert lost == {Ending.RANK_LOST, Ending.CHECKPOINT_WRITE, Ending.CRASHED, Ending.STALLED, Ending.CODE}
    assert released == {Ending.STOPPED, Ending.STORAGE, Ending.NODE_RELEASED}  # uncounted: not the job's, nor this node's
    assert ACTIONS[Ending.FAILED].kind == "fail" and ACTIONS[Ending.FENCED].kind == "none"
    assert {ACTIONS[Ending.SUCCEEDED].state, ACTIONS[Ending.CANCELLED].state} == {JobState.succeeded, JobState.cancelled}
    assert all(action.retried for action in ACTIONS.values() if action.kind in ("lose", "release"))
