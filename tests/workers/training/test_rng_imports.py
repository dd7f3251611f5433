"""Importing a module must not move a job's random streams: otherwise a job's result depends on
whether that module was already imported in the process (a test process that ran another job, a
worker that did, an in-process reference against a `baton run` process)."""
from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import numpy as np
import torch

from baton.workers.training import rng
from baton.workers.training.targets import resolve


def states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()


def test_importing_a_user_module_that_draws_leaves_every_generator_as_it_was():
    sys.modules.pop("tests.draws_at_import", None)
    rng.seed_all(7)
    before = states()
    resolve("tests.draws_at_import:make_model", {}, ("tests",))
    after = states()
    assert after[0] == before[0] and after[1] == before[1] and torch.equal(after[2], before[2])


def test_the_scikit_learn_data_sets_build_the_same_whether_or_not_it_was_imported():
    """In a fresh process (scikit-learn's first import there reseeds Python's random)."""
    script = textwrap.dedent("""
        import random
        from baton.workers.training import builtins, rng
        rng.seed_all(7)
        before = random.getstate()
        builtins.diabetes(seed=7)
        builtins.digits(seed=7)
        print(random.getstate() == before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stdout + out.stderr
