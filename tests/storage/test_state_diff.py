import math

import torch

from baton.storage.state_diff import count_tensors, first_difference


def test_identical_states_have_no_difference():
    a = {"model": {"w": torch.ones(3)}, "opt": [1, 2.0, math.nan], "rng": (1, None)}
    b = {"model": {"w": torch.ones(3)}, "opt": [1, 2.0, math.nan], "rng": (1, None)}
    assert first_difference(a, b) is None and count_tensors(a) == 1


def test_the_smallest_difference_is_found_and_named():
    w = torch.ones(3)
    v = w.clone()
    v[1] = torch.nextafter(v[1], torch.tensor(2.0))  # one ulp
    assert first_difference({"m": {"w": w}}, {"m": {"w": v}}) == "state.m.w: tensors differ"
    assert first_difference({"w": w}, {"w": w.double()}).startswith("state.w: torch.float32")
    assert first_difference({"a": 1}, {"b": 1}) == "state: keys differ"
    assert first_difference([1, 2], [1, 3]) == "state[1]: 2 != 3"
