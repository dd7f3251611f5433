"""``--set`` and ``--grid`` parsing, applied to a raw spec and validated as the spec itself."""
from __future__ import annotations

import pytest

from baton.jobs.specfile import load_spec
from baton.schemas.errors import SpecError
from baton.schemas.overrides import (
    apply_overrides,
    grid_points,
    normalize,
    normalize_grid,
    parse_assignment,
    parse_axis,
)
from baton.schemas.spec import JobSpec
from tests.helpers import make_spec


def test_values_are_yaml_scalars_and_flow_collections():
    assert parse_assignment("optimizer.lr=1e-3") == ("optimizer.lr", 0.001)  # YAML 1.1 would say '1e-3'
    assert parse_assignment("loop.epochs=5") == ("loop.epochs", 5)
    assert parse_assignment("loop.deterministic=false") == ("loop.deterministic", False)
    assert parse_assignment("checkpoint.every_steps=null") == ("checkpoint.every_steps", None)
    assert parse_assignment("optimizer.name=sgd") == ("optimizer.name", "sgd")
    assert parse_assignment("model.kwargs={hidden: 8, dropout: 0.5}") == ("model.kwargs", {"hidden": 8, "dropout": 0.5})
    assert parse_axis("optimizer.lr=1e-3,3e-3") == ("optimizer.lr", [0.001, 0.003])
    assert parse_axis("model.kwargs.sizes=[64,64],[128]") == ("model.kwargs.sizes", [[64, 64], [128]])


@pytest.mark.parametrize("text", ["optimizer.lr", "=3", "optimizer..lr=1", "optimizer.lr=[1,"])
def test_malformed_assignments_are_spec_errors(text):
    with pytest.raises(SpecError):
        parse_assignment(text)


def test_overrides_apply_to_the_raw_mapping_then_validate_as_the_spec():
    raw = make_spec()
    spec = JobSpec.parse(apply_overrides(raw, normalize(["optimizer.lr=1e-3", "loop.epochs=5", "seed=7"])))
    assert (spec.optimizer.lr, spec.loop.epochs, spec.seed) == (0.001, 5, 7)
    assert raw["optimizer"]["lr"] == 0.01  # the caller's mapping is not changed
    with pytest.raises(SpecError) as bad:
        JobSpec.parse(apply_overrides(raw, {"optimizer.lrr": 0.1, "loop.epochs": "five"}))
    assert "optimizer.lrr: unknown field (did you mean `lr`?)" in bad.value.problems
    assert any(p.startswith("loop.epochs: must be an integer") for p in bad.value.problems)
    with pytest.raises(SpecError, match=r"optimizer.lr.x: optimizer.lr is float"):
        apply_overrides(raw, {"optimizer.lr.x": 1})


def test_a_missing_section_is_created_and_a_jobspec_source_takes_overrides_too():
    raw = make_spec()
    assert "retry" not in raw
    assert load_spec(raw, overrides={"retry.max_attempts": 9}).retry.max_attempts == 9
    spec = load_spec(make_spec())
    assert load_spec(spec, overrides=["optimizer.lr=2e-3"]).optimizer.lr == 0.002
    assert load_spec(spec, overrides=["optimizer.lr=2e-3"]).model_copy(update={"optimizer": spec.optimizer}) == spec


def test_grid_points_are_the_product_first_axis_slowest():
    axes = normalize_grid(["optimizer.lr=1e-3,3e-3", "seed=1,2,3"])
    points = grid_points(axes)
    assert len(points) == 6
    assert points[:3] == [{"optimizer.lr": 0.001, "seed": s} for s in (1, 2, 3)]
    with pytest.raises(SpecError, match="non-empty list"):
        normalize_grid({"seed": []})
    with pytest.raises(SpecError, match="at least one axis"):
        normalize_grid([])
