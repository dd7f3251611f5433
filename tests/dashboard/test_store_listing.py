"""How often the dashboard and the server list the store for the jobs Redis does not hold: every
``--history-every-s`` while a listing is quick, and less often once a listing takes long enough to cost
more than 5 % of the time (a store of tens of thousands of jobs)."""
from __future__ import annotations

import pytest

from baton.dashboard.listing import LISTING_SHARE, next_listing_in


@pytest.mark.parametrize("took_s", [0.0, 0.1, 1.0, 1.5])
def test_a_quick_listing_waits_the_period(took_s):
    assert next_listing_in(30.0, took_s) == 30.0


@pytest.mark.parametrize("took_s", [2.0, 5.0, 30.0])
def test_a_slow_listing_keeps_to_its_share_of_the_time(took_s):
    wait = next_listing_in(30.0, took_s)
    assert wait > 30.0 and took_s / (took_s + wait) == pytest.approx(LISTING_SHARE)
