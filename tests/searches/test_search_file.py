"""The search file and the trials it samples, without workers: every wrong field named at once (a
value of the space that would make a bad spec, or reach a module the pool does not allow, included);
the same file and seed give the same trials, a round of TPE learns from the first rung's values and from
nothing else; a grid is taken in order (a seeded subset when it has more points than trials)."""
from __future__ import annotations

import pytest

from baton.jobs.search_submit import check_search
from baton.schemas.errors import SpecError
from baton.schemas.search import SearchSpec
from baton.searches.sampling import Told, grid, sample_round

from tests.helpers import make_spec, run_baton, write_spec

SPACE = {"optimizer.lr": {"loguniform": [1.0e-4, 1.0e-1]}, "model.kwargs.hidden": {"choice": [8, 16, [4, 4]]},
         "data.batch_size": {"int": [16, 64]}}


def search(**fields) -> SearchSpec:
    return SearchSpec.parse({"space": SPACE, "trials": 6, **fields})


@pytest.mark.parametrize("raw, named", [
    ({"space": {}, "trials": 2}, "search.space: must have at least 1 item"),
    ({"space": {"optimizer.lr": {"uniform": [1, 0]}}, "trials": 2}, "search.space.optimizer.lr.uniform: the low bound"),
    ({"space": {"optimizer.lr": {"loguniform": [0, 1]}}, "trials": 2}, "search.space.optimizer.lr.loguniform: bounds"),
    ({"space": {"optimizer.lr": {"uniform": [0, 1], "choice": [1]}}, "trials": 2}, "give exactly one of"),
    ({"space": {"optimizer.lr": {"uniform": [0, 1]}}}, "search.trials: how many to sample"),
    ({"space": {"optimizer.lr": {"uniform": [0, 1]}}, "sampler": "grid"}, "a grid takes choice and int ranges only"),
    ({"space": {"seed": {"choice": [1, 2]}}, "sampler": "grid", "trials": 3}, "more than the grid's 2 points"),
    ({"space": {"seed": {"choice": [1]}}, "trials": 2, "halving": {"min_resource": 1, "factor": 1}},
     "search.halving.factor: "),
    ({"space": {"seed": {"choice": [1]}}, "trials": 2, "sampler": "bayes"}, "search.sampler: "),
    ({"space": {"seed": {"choice": [1]}}, "trails": 2}, "search.trails: unknown field (did you mean `trials`?)"),
    ({"space": {"seed": [1, 2]}, "trials": 2}, "search.space.seed: must be a mapping (got list)"),
    ({"space": {"seed": {"choice": [1]}}, "trials": 2, "seed": -1}, "search.seed: must be >= 0"),
])
def test_every_wrong_field_is_named(raw, named):
    with pytest.raises(SpecError, match="invalid search") as caught:
        SearchSpec.parse(raw)
    assert any(named in problem for problem in caught.value.problems), caught.value.problems


def test_a_value_that_makes_a_bad_spec_or_reaches_a_stranger_module_refuses_the_search():
    raw = make_spec(loop={"epochs": 4})
    bad = SearchSpec.parse({"space": {"optimizer.name": {"choice": ["adamw", "nesterov"]},
                                      "model.target": {"choice": ["builtin:mlp", "evil.payload:model"]}},
                            "trials": 2, "halving": {"min_resource": 4}})
    with pytest.raises(SpecError, match="invalid search") as caught:
        check_search(raw, bad, ("tests",))
    problems = "\n".join(caught.value.problems)
    assert "search.space.optimizer.name ('nesterov')" in problems
    assert "search.space.model.target ('evil.payload:model')" in problems and "evil" in problems
    assert "search.halving.min_resource: 4 is not below the run's 4 epochs" in problems
    spec, unit, end = check_search(raw, SearchSpec.parse({"space": {"optimizer.lr": {"uniform": [0.001, 0.1]}},
                                                          "trials": 2}), ("tests",))
    assert (unit, end) == ("epochs", 4)


def test_the_same_file_and_seed_give_the_same_trials_and_tpe_learns_only_from_the_first_rung():
    for sampler in ("random", "tpe"):
        s = search(sampler=sampler, concurrency=3)
        first = sample_round(s, 0, [], "min")
        assert first == sample_round(s, 0, [], "min") and len(first) == 3
        assert first != sample_round(search(sampler=sampler, concurrency=3, seed=1), 0, [], "min")
        assert all(p["model.kwargs.hidden"] in (8, 16, [4, 4]) and 16 <= p["data.batch_size"] <= 64 for p in first)
        told = [Told(p, float(i)) for i, p in enumerate(first)]
        assert sample_round(s, 1, told, "min") == sample_round(s, 1, told, "min")
    tpe = search(sampler="tpe", concurrency=3, trials=40)
    history = [Told(p, float(p["optimizer.lr"])) for p in sample_round(tpe, 0, [], "min")]
    history += [Told(p, float(p["optimizer.lr"])) for p in sample_round(tpe, 1, history, "min")]
    history += [Told(p, float(p["optimizer.lr"])) for p in sample_round(tpe, 2, history, "min")]
    history += [Told(p, float(p["optimizer.lr"])) for p in sample_round(tpe, 3, history, "min")]
    reversed_values = [Told(t.params, -t.value) for t in history]
    assert sample_round(tpe, 4, history, "min") != sample_round(tpe, 4, reversed_values, "min")


def test_a_grid_in_order_or_a_seeded_subset():
    s = SearchSpec.parse({"space": {"seed": {"choice": [1, 2, 3]}, "data.batch_size": {"int": [16, 17]}},
                          "sampler": "grid"})
    assert s.size == 6 and grid(s)[:2] == [{"seed": 1, "data.batch_size": 16}, {"seed": 1, "data.batch_size": 17}]
    fewer = SearchSpec.parse({"space": {"seed": {"choice": [1, 2, 3]}, "data.batch_size": {"int": [16, 17]}},
                              "sampler": "grid", "trials": 4, "seed": 5})
    assert len(grid(fewer)) == 4 and grid(fewer) == grid(fewer) and set(map(str, grid(fewer))) <= set(map(str, grid(s)))


def test_halving_rungs_and_survivors():
    s = SearchSpec.parse({"space": SPACE, "trials": 27, "halving": {"min_resource": 2, "factor": 3}})
    assert s.halving.rungs(18) == [2, 6, 18] and s.halving.rungs(20) == [2, 6, 18, 20]
    assert [s.halving.survivors(27, k) for k in range(4)] == [27, 9, 3, 1]


def test_the_command_line_takes_a_grid_or_a_search_and_names_a_missing_search(tmp_path):
    spec = write_spec(tmp_path, make_spec())
    (tmp_path / "search.yaml").write_text("space: {optimizer.lr: {uniform: [0.01, 0.1]}}\ntrials: 2\n")
    both = run_baton("sweep", str(spec), "--grid", "seed=1,2", "--search", str(tmp_path / "search.yaml"),
                     env=None)
    assert both.returncode == 2 and "give --grid (a full grid) or --search FILE" in both.stderr, both.stderr
    assert len(both.stderr.strip().splitlines()) == 1


def test_the_documented_example_search_is_valid():
    import yaml

    from baton.jobs.search_submit import read_search
    from tests.helpers import REPO

    found = read_search(REPO / "examples" / "searches" / "spiral.yaml")
    raw = yaml.safe_load((REPO / "examples" / "spiral.yaml").read_text())
    spec, unit, end = check_search(raw, found, ())
    assert (found.size, found.round_size, unit, end) == (27, 9, "epochs", 20)
    assert found.halving is not None and found.halving.rungs(end) == [2, 6, 18, 20]


def test_the_first_search_in_the_docs_is_valid_with_its_set():
    import re

    import yaml

    from baton.jobs.search_submit import read_search
    from baton.jobs.specfile import with_overrides
    from tests.helpers import REPO

    page = (REPO / "docs" / "searches.md").read_text()
    found = read_search(yaml.safe_load(re.search(r"<<'YAML'\n(.*?)YAML\n", page, re.S).group(1)))
    raw = with_overrides(yaml.safe_load((REPO / "examples" / "spiral.yaml").read_text()), {"loop.epochs": 6})
    spec, unit, end = check_search(raw, found, (), ("loop.epochs",))
    assert found.halving is not None and found.halving.rungs(end) == [2, 6] and found.halving.survivors(4, 1) == 1


def test_a_search_file_that_is_not_yaml_is_named_with_its_line(tmp_path):
    from baton.jobs.search_submit import read_search

    bad = tmp_path / "bad.yaml"
    bad.write_text("space: {optimizer.lr: {uniform: [0.1, 0.2]}\ntrials: 2\n")  # a brace never closed
    with pytest.raises(SpecError) as caught:
        read_search(bad)
    assert caught.value.problems == [f"search: {bad} is not YAML, line 2 (while parsing a flow mapping)"]
