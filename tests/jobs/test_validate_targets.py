"""`baton validate`/`submit` catch a misspelled user target when its module imports on this machine,
and say when it cannot be checked here."""
from __future__ import annotations

from tests.helpers import baton_env, make_spec, run_baton, write_spec


def test_a_misspelled_callable_is_refused_with_suggestions(tmp_path):
    spec = write_spec(tmp_path, make_spec(model={"target": "tests.probes:recording_mpl", "kwargs": {}}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2
    assert ("model.target: module 'tests.probes' has no callable 'recording_mpl'; did you mean 'recording_mlp'"
            in result.stderr), result.stderr


def test_a_module_not_importable_here_is_left_to_the_worker_and_said_so(tmp_path):
    spec = write_spec(tmp_path, make_spec(task={"target": "teamcode.tasks:triage"}, checkpoint={"monitor": "val_loss"}))
    result = run_baton("validate", str(spec), env=baton_env(BATON_ALLOWED_MODULES="tests,teamcode"))
    assert result.returncode == 0, result.stderr
    assert "task.target: module 'teamcode.tasks' is not importable here; it is checked on the worker" in result.stdout
