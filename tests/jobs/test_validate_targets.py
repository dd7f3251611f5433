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


def test_kwargs_the_callable_does_not_take_are_refused_naming_what_it_takes(tmp_path):
    spec = write_spec(tmp_path, make_spec(model={"target": "tests.probes:linear", "kwargs": {"in_feature": 2}}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2
    assert ("model.kwargs: tests.probes:linear takes no argument 'in_feature' (it takes: in_features, out_features)"
            in result.stderr), result.stderr


def test_a_required_argument_left_out_is_refused_but_the_seed_baton_passes_is_not(tmp_path):
    spec = write_spec(tmp_path, make_spec(data={"target": "tests.tasks:pairs_to_dicts", "kwargs": {}}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2 and "data.kwargs: tests.tasks:pairs_to_dicts needs 'samples'" in result.stderr
    seeded = write_spec(tmp_path, make_spec(data={"target": "tests.probes:blobs", "kwargs": {"n": 90}}), "seeded.yaml")
    assert run_baton("validate", str(seeded)).returncode == 0


def test_a_module_missing_from_a_package_that_imports_here_is_refused(tmp_path):
    spec = write_spec(tmp_path, make_spec(model={"target": "tests.no_such_module:net", "kwargs": {}}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2
    assert "model.target: module 'tests.no_such_module' does not exist (its package 'tests' imports here)" in result.stderr


def test_a_warmup_as_long_as_a_step_based_run_is_refused(tmp_path):
    spec = write_spec(tmp_path, make_spec(loop={"epochs": None, "max_steps": 40},
                                          scheduler={"name": "warmup_cosine", "warmup_steps": 40}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2
    assert "scheduler.warmup_steps: a warmup of 40 steps leaves none of the run's 40 (loop.max_steps)" in result.stderr


def test_one_malformed_target_does_not_hide_the_others(tmp_path):
    """Every wrong field at once: a task target that does not parse, a misspelled model callable and
    a module missing from its package, all in one refusal."""
    spec = write_spec(tmp_path, make_spec(task={"target": "a.b.c"},
                                          model={"target": "tests.probes:recording_mpl", "kwargs": {}},
                                          data={"target": "tests.no_such_module:spiral", "kwargs": {}}))
    result = run_baton("validate", str(spec))
    assert result.returncode == 2
    for line in ("task.target: must be 'builtin:NAME' or 'package.module:callable' (got 'a.b.c')",
                 "model.target: module 'tests.probes' has no callable 'recording_mpl'",
                 "data.target: module 'tests.no_such_module' does not exist"):
        assert line in result.stderr, result.stderr


def test_a_wrong_target_is_said_beside_another_wrong_field_of_its_section(tmp_path):
    for target, said in (("builtin:spirall", "data.target: unknown built-in 'spirall'"),
                         ("mypkg", "data.target: must be 'builtin:NAME' or 'package.module:callable' (got 'mypkg')")):
        spec = write_spec(tmp_path, make_spec(data={"target": target, "batch_size": 0}))
        result = run_baton("validate", str(spec))
        assert result.returncode == 2
        assert "data.batch_size: must be > 0" in result.stderr and said in result.stderr, result.stderr


def test_targets_are_checked_from_their_source_without_importing_the_jobs_code(tmp_path):
    """Importing a model's module can take tens of seconds (transformers) and do anything: validate and
    submit read its source instead, and still catch a misspelling and kwargs the callable does not take."""
    mark = tmp_path / "imported"
    env = baton_env(IMPORT_MARK=str(mark))
    wrong = make_spec(model={"target": "tests.imports_loudly:modle", "kwargs": {"width": 4}},
                      data={"target": "tests.imports_loudly:Pairs", "kwargs": {"size": 64}})
    result = run_baton("validate", str(write_spec(tmp_path, wrong)), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("model.target: module 'tests.imports_loudly' has no callable 'modle'; did you mean 'model'"
            in result.stderr), result.stderr
    assert ("data.kwargs: tests.imports_loudly:Pairs takes no argument 'size' (it takes: n, seed)"
            in result.stderr), result.stderr
    right = make_spec(model={"target": "tests.imports_loudly:model", "kwargs": {"width": 2}},
                      data={"target": "tests.imports_loudly:Pairs", "kwargs": {"n": 64}})
    result = run_baton("validate", str(write_spec(tmp_path, right, "right.yaml")), env=env)
    assert result.returncode == 0, result.stderr
    assert "model.target: tests.imports_loudly:model found" in result.stdout
    assert not mark.exists()  # the module was never imported


def test_no_package_of_the_job_is_imported_and_a_conditional_definition_is_not_misread(tmp_path):
    """An optional import's fallback (`try: from x import Quick` / `except: class Quick`) is not taken for
    the definition; a misspelled module under a package whose __init__ is expensive, and a star import,
    are settled without running that __init__."""
    package = tmp_path / "src" / "loudpkg"
    package.mkdir(parents=True)
    mark = tmp_path / "imported"
    (package / "__init__.py").write_text(f"open({str(mark)!r}, 'w').write('imported')\n")
    (package / "opt.py").write_text("try:\n    from torch.nn import Linear as Quick\nexcept ImportError:\n"
                                    "    class Quick:\n        def __init__(self, a=1):\n            pass\n")
    (package / "star.py").write_text("from torch.nn import *  # noqa\n")
    env = baton_env(BATON_ALLOWED_MODULES="loudpkg", PYTHONPATH=f"{tmp_path / 'src'}:{baton_env()['PYTHONPATH']}")
    spec = make_spec(model={"target": "loudpkg.opt:Quick", "kwargs": {"in_features": 2, "out_features": 3}},
                     data={"target": "loudpkg.star:Spiral", "kwargs": {}})
    result = run_baton("validate", str(write_spec(tmp_path, spec)), env=env)
    assert result.returncode == 0, result.stdout + result.stderr  # Quick takes in_features in the branch that runs
    assert ("data.target: module 'loudpkg.star' may define 'Spiral' only when it runs (a star import or a module "
            "__getattr__); it is checked on the worker") in result.stdout, result.stdout
    misspelled = make_spec(model={"target": "loudpkg.nomod:model", "kwargs": {}})
    result = run_baton("validate", str(write_spec(tmp_path, misspelled, "misspelled.yaml")), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert ("model.target: module 'loudpkg.nomod' does not exist (its package 'loudpkg' imports here)"
            in result.stderr), result.stderr
    assert not mark.exists()  # loudpkg's __init__ never ran
