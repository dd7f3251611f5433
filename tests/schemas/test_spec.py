"""The job spec: valid examples load; each malformed spec is rejected naming the wrong field."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.jobs.specfile import load_spec
from baton.schemas.errors import SpecError
from baton.schemas.spec import JobSpec
from tests.helpers import REPO, make_spec


def _set(path: str, value):
    """A spec with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    spec = make_spec()
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node[key]
    if value is ...:
        del node[leaf]
    else:
        node[leaf] = value
    return spec


BAD_SPECS = [
    # (what is wrong, the spec, the field the message must name, a phrase it must contain)
    ("lr zero", _set("optimizer.lr", 0), "optimizer.lr", "> 0"),
    ("lr as a string", _set("optimizer.lr", "0.1"), "optimizer.lr", "number"),
    ("unknown optimizer", _set("optimizer.name", "lion"), "optimizer.name", "one of"),
    ("momentum with adamw", _set("optimizer.momentum", 0.9), "optimizer.momentum", "only sgd"),
    ("unknown top-level key", {**make_spec(), "epochs": 3}, "epochs", "unknown field (did you mean `loop.epochs`?)"),
    ("misspelled loop key", _set("loop.grad_acum_steps", 2), "loop.grad_acum_steps",
     "unknown field (did you mean `grad_accum_steps`?)"),
    ("unknown loop key", _set("loop.zzz", 2), "loop.zzz", "unknown field"),
    ("epochs missing", _set("loop.epochs", ...), "loop.epochs", "exactly one of epochs"),
    ("epochs and max_steps", _set("loop.max_steps", 100), "loop.epochs", "exactly one of epochs"),
    ("eval beyond the run", {**make_spec(), "loop": {"max_steps": 10, "eval_every_steps": 20}},
     "loop.eval_every_steps", "beyond max_steps"),
    ("per-epoch schedule in a step run", {**make_spec(), "loop": {"max_steps": 10}, "scheduler": {"name": "cosine"}},
     "scheduler.name", "per-step schedule"),
    ("epochs negative", _set("loop.epochs", -1), "loop.epochs", "> 0"),
    ("precision unknown", _set("loop.precision", "fp8"), "loop.precision", "one of"),
    ("fp16 on the cpu", _set("loop.precision", "fp16"), "loop.precision", "cuda"),
    ("nonfinite policy unknown", _set("loop.nonfinite", "ignore"), "loop.nonfinite", "one of"),
    ("keep_last 1", _set("checkpoint.keep_last", 1), "checkpoint.keep_last", ">= 2"),
    ("monitor not a metric name", _set("checkpoint.monitor", "f1"), "checkpoint.monitor", "must match"),
    ("monitor not reported by the task", _set("checkpoint.monitor", "val_f1"), "checkpoint.monitor",
     "not reported by task builtin:classification; choose one of ['train_loss', 'val_accuracy', 'val_loss']"),
    ("regression has no accuracy", {**make_spec(), "task": {"target": "builtin:regression"},
                                    "checkpoint": {"monitor": "val_accuracy"}}, "checkpoint.monitor", "val_mae"),
    ("mae maximised", {**make_spec(), "task": {"target": "builtin:regression"},
                       "checkpoint": {"monitor": "val_mae", "mode": "max"}}, "checkpoint.mode", "mode: min"),
    ("user metric without a mode", {**make_spec(), "task": {"target": "tests.tasks:dict_task"},
                                    "checkpoint": {"monitor": "val_f1"}}, "checkpoint.mode", "min"),
    ("unknown builtin task", _set("task", {"target": "builtin:detection"}), "task.target", "unknown built-in"),
    ("task kwarg misspelled", _set("task", {"target": "builtin:language_model", "kwargs": {"ignore": 0}}),
     "task.kwargs.ignore", "unknown field"),
    ("val set and val_fraction", _set("data.val", {"target": "builtin:digits"}), "data.val_fraction", "not both"),
    ("builtin collate", _set("data.collate", {"target": "builtin:spiral"}), "data.collate.target", "no built-in"),
    ("accuracy minimised", {**make_spec(), "checkpoint": {"monitor": "val_accuracy", "mode": "min"}},
     "checkpoint.mode", "mode: max"),
    ("every_steps zero", _set("checkpoint.every_steps", 0), "checkpoint.every_steps", "> 0"),
    ("batch size zero", _set("data.batch_size", 0), "data.batch_size", "> 0"),
    ("no held-out split", _set("data.val_fraction", 0.0), "data.val_fraction", "> 0"),
    ("negative workers", _set("data.num_workers", -1), "data.num_workers", ">= 0"),
    ("bad target syntax", _set("model.target", "not a target"), "model.target", "builtin:NAME"),
    ("unknown builtin", _set("data.target", "builtin:mnist"), "data.target", "unknown built-in"),
    ("builtin kwarg misspelled", _set("model.kwargs", {"hiden": 3}), "model.kwargs.hiden",
     "unknown field (did you mean `hidden`?)"),
    ("builtin kwarg out of range", _set("model.kwargs", {"dropout": 1.5}), "model.kwargs.dropout", "< 1.0"),
    ("device unknown", _set("resources.device", "tpu"), "resources.device", "one of"),
    ("bad job name", _set("name", "has spaces"), "name", "must match"),
    ("seed negative", _set("seed", -3), "seed", ">= 0"),
    ("retry zero", {**make_spec(), "retry": {"max_attempts": 0}}, "retry.max_attempts", "> 0"),
    ("onecycle without warmup", _set("scheduler.warmup_fraction", 0.0), "scheduler.warmup_fraction", "warmup > 0"),
    ("section not a mapping", _set("optimizer", "adamw"), "optimizer", "mapping"),
]


@pytest.mark.parametrize("what,spec,field,phrase", BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_rejected_naming_the_field(what, spec, field, phrase):
    with pytest.raises(SpecError) as caught:
        JobSpec.parse(spec)
    lines = caught.value.problems
    matching = [line for line in lines if line.startswith(f"{field}: ")]
    assert matching, f"no problem names {field!r}: {lines}"
    assert phrase in matching[0], matching[0]


def test_every_problem_is_reported_at_once():
    spec = make_spec(checkpoint={"keep_last": 1, "monitor": "val_accuracy", "mode": "min"})
    with pytest.raises(SpecError) as caught:
        JobSpec.parse(spec)
    assert {line.split(":")[0] for line in caught.value.problems} == {"checkpoint.keep_last", "checkpoint.mode"}


@pytest.mark.parametrize("example", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example: Path):
    assert load_spec(example).name


def test_json_and_yaml_and_dict_load_the_same_spec(tmp_path):
    spec = JobSpec.parse(make_spec())
    (tmp_path / "s.json").write_text(spec.model_dump_json())
    assert load_spec(tmp_path / "s.json") == load_spec(make_spec()) == spec
    assert JobSpec.parse(spec.model_dump(mode="json")) == spec  # a JSON round trip (Celery) keeps it


def test_module_outside_the_allowlist_is_refused_with_how_to_allow_it():
    spec = make_spec(model={"target": "os.path:join", "kwargs": {"a": "x"}})  # join(a="x"): the arguments fit
    with pytest.raises(SpecError) as caught:
        load_spec(spec, allowed_prefixes=("mycompany",))
    assert caught.value.problems[0].startswith("model.target: module 'os.path' is not allowed")
    assert "BATON_ALLOWED_MODULES" in caught.value.problems[0]
    assert load_spec(spec, allowed_prefixes=("os",)).model.target == "os.path:join"
    with pytest.raises(SpecError):  # a prefix is a package boundary, not a string prefix
        load_spec(spec, allowed_prefixes=("os.pa",))


def test_unreadable_files_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(tmp_path / "broken.yaml")


def test_misspelled_settings_are_named():
    from baton.schemas.settings import unknown_variables

    env = {"BATON_LEASE_TTL": "5", "BATON_LEASE_TTL_S": "5", "BATON_BUCKET": "b", "PATH": "/bin"}
    assert unknown_variables(env) == ["BATON_LEASE_TTL"]


def test_tuning_variables_the_deploy_files_set_are_not_called_misspelled():
    """deploy/ sets BATON_BACKGROUND_NICE: the CLI said it was 'ignored' while it was in effect."""
    from baton.schemas.settings import unknown_variables

    tuning = ("BATON_BACKGROUND_NICE", "BATON_CHECKPOINT_WRITER", "BATON_RENDEZVOUS_TIMEOUT_S",
              "BATON_COLLECTIVE_TIMEOUT_S")
    assert unknown_variables({name: "1" for name in tuning}) == []
    for path in ("deploy/.env.example",):
        text = (Path(__file__).resolve().parents[2] / path).read_text()
        set_there = {line.split("=")[0].strip() for line in text.splitlines() if line.startswith("BATON_")}
        assert unknown_variables({name: "1" for name in set_there}) == []


def test_settings_refuse_a_heartbeat_that_cannot_keep_the_lease(monkeypatch):
    import pydantic

    from baton.schemas.settings import BatonSettings

    with pytest.raises(pydantic.ValidationError, match="BATON_HEARTBEAT_S"):
        BatonSettings(lease_ttl_s=2, heartbeat_s=1.5)
    with pytest.raises(pydantic.ValidationError, match="s3:// or file://"):
        BatonSettings(storage_url="gs://bucket")


def test_an_unreported_monitor_is_named_even_when_another_section_is_wrong():
    # the monitor is checked at the job level, which pydantic skips once a section fails
    with pytest.raises(SpecError) as caught:
        JobSpec.parse(make_spec(optimizer={"lr": 0}, checkpoint={"monitor": "val_mae", "keep_last": 1}))
    fields = {line.split(":")[0] for line in caught.value.problems}
    assert fields == {"optimizer.lr", "checkpoint.keep_last", "checkpoint.monitor"}, caught.value.problems
