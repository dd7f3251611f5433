"""Submitting a search (``JobClient.search``, ``baton sweep SPEC --search FILE``): the job spec and the
search file validated together (every bound and choice of the space applied to the spec alone, and the
rungs against the run's length), the spec's code shipped once for every trial, the search's record
written, and its first round of trials created and queued."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from baton.schemas.errors import SpecError
from baton.schemas.overrides import Overrides, normalize
from baton.schemas.search import SearchSpec
from baton.schemas.spec import NAME_PATTERN, JobSpec
from baton.storage.layout import check_job_id, new_job_id
from baton.storage.records import searches
from baton.storage.stores.open import open_client_store

from baton.jobs.code_ship import code_dir, importable
from baton.jobs.specfile import SpecSource, check_spec, read_raw, with_overrides

if TYPE_CHECKING:
    from baton.jobs.client import JobClient


def read_search(source: "str | Path | dict") -> SearchSpec:
    """A search file (YAML or JSON) or mapping, validated; SpecError naming every wrong field."""
    if isinstance(source, dict):
        return SearchSpec.parse(source)
    import yaml

    path = Path(source)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SpecError([f"search: cannot read {path}: {exc.strerror or exc}"], "search") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise SpecError([f"search: {path} is not YAML{where} ({str(exc).splitlines()[0]})"], "search") from None
    return SearchSpec.parse(raw)


def check_search(raw: Any, search: SearchSpec, allowed_prefixes: tuple[str, ...],
                 fixed: tuple[str, ...] = ()) -> tuple[JobSpec, str, int]:
    """The spec, its unit (epochs or steps) and its end; SpecError naming every problem: each choice and
    bound of the space applied to the spec alone (a problem once per path), a path both searched and
    ``fixed`` (set by an override: every trial would overwrite it), and halving's first rung against the
    run's end."""
    spec = check_spec(raw, allowed_prefixes)
    problems = [f"search.space.{path}: also set by --set/overrides ({given}); the search would overwrite it in "
                f"every trial: drop one" for path in search.space for given in fixed if _overlap(path, given)]
    problems += [f"search.space.{path}: a search cannot search a trial's {held.split('.')[1]} (every trial is the "
                 f"search's, under its team's limits): set it in the spec" for path in search.space
                 for held in ("resources.team", "resources.priority") if _overlap(path, held)]
    problems += [f"search.space.{path}: a search cannot search a trial's code (every trial runs the search's, "
                 "shipped once): set it in the spec" for path in search.space if _overlap(path, "code")]
    for path, dimension in search.space.items():
        seen: set[str] = set()
        for value in dimension.choice if dimension.choice is not None else list(dimension.bounds or ()):
            try:
                check_spec(with_overrides(raw, {path: value}), allowed_prefixes)
            except SpecError as exc:
                problems += [f"search.space.{path} ({value!r}): {p}" for p in exc.problems if p not in seen]
                seen.update(exc.problems)
    unit, end = ("epochs", spec.loop.epochs) if spec.loop.epochs is not None else ("steps", spec.loop.max_steps)
    assert end is not None  # (a spec sets one or the other)
    if search.halving is not None:
        problems += _halving_problems(raw, search, spec, unit, end)
    if problems:
        raise SpecError(problems, "search")
    return spec, unit, end


def _overlap(path: str, other: str) -> bool:
    """Whether one dotted path is the other or holds it (``optimizer`` holds ``optimizer.lr``)."""
    return path == other or path.startswith(other + ".") or other.startswith(path + ".")


def _halving_problems(raw: Any, search: SearchSpec, spec: JobSpec, unit: str, end: int) -> list[str]:
    """A trial stopped at a rung pauses there: one node only, at a validation of its own."""
    assert search.halving is not None
    problems = []
    for path in search.space:
        if _overlap(path, "loop.epochs") or _overlap(path, "loop.max_steps"):
            problems.append(f"search.space.{path}: a search that halves cannot search the run's length (its rungs are "
                            f"the spec's: {unit} up to {end}); search it without halving, or fix it with --set")
    if search.halving.min_resource >= end:
        problems.append(f"search.halving.min_resource: {search.halving.min_resource} is not below the run's {end} "
                        f"{unit} (loop.{'epochs' if unit == 'epochs' else 'max_steps'}): no rung to stop at")
    if unit == "steps" and spec.loop.eval_every_steps is None:
        problems.append("search.halving: a run of loop.max_steps validates only at its end: set loop.eval_every_steps "
                        "(a trial pauses at the first validation at or past each rung)")
    searched = search.space.get("resources.nodes")
    nodes: list[float] = [spec.resources.nodes]
    if searched is not None:
        nodes += [v for v in searched.values() or list(searched.bounds or ()) if isinstance(v, (int, float))]
    if max(nodes) > 1:
        problems.append(f"search.halving: a trial of {max(nodes)} nodes cannot pause at a rung (one node only)")
    return problems


def check_trials(raw: dict, search: SearchSpec, mode: str, search_id: str) -> None:
    """Every trial that can be known before any has trained (a grid's, random sampling's; TPE's first round),
    as its spec and id: SpecError naming each that would be invalid."""
    from baton.searches.driver import trial_id, trial_spec
    from baton.searches.sampling import known_trials

    problems: list[str] = []
    try:
        check_job_id(trial_id(search_id, search.size, search.size))
    except ValueError as exc:
        problems.append(f"id: {search_id!r} leaves no room for its trials' numbers ({exc})")
    for number, params in enumerate(known_trials(search, mode), start=1):
        job_id = trial_id(search_id, search.size, number)
        try:
            JobSpec.parse(trial_spec(raw, params, job_id))
        except SpecError as exc:
            problems += [f"search trial {number} {params}: {p}" for p in exc.problems]
    if problems:
        raise SpecError(problems[:20], "search")


def submit_search(client: "JobClient", spec: SpecSource, search: "str | Path | dict", overrides: Overrides = None,
                  search_id: Optional[str] = None, code: "str | Path | None" = None) -> str:
    """The search's id, once its record is written and its first trials are queued."""
    from baton.jobs.client import warn_if_local
    from baton.searches.driver import trial_id

    found = read_search(search)
    raw = read_raw(spec)
    given = raw.get("name") if isinstance(raw, dict) else None
    name = given if isinstance(given, str) and re.match(NAME_PATTERN, given) else "job"
    try:
        search_id = check_job_id(search_id or new_job_id(f"{name}-search"))
    except ValueError as exc:
        raise SpecError([f"search_id: {exc}"], "search") from None
    wanted = {**normalize(overrides), **({"code.dir": str(code)} if code is not None else {})}
    raw = with_overrides(raw, wanted)
    with importable(code_dir(raw)):
        parsed, unit, end = check_search(raw, found, client.settings.allowed_prefixes, tuple(wanted))
    client._check_limits([parsed])
    try:
        check_trials(raw, found, parsed.monitor_mode, search_id)
    except ImportError as exc:
        raise SpecError([f"sampler: {found.sampler} sampling needs Optuna here ({exc}): pip install 'baton[search]'"],
                        "search") from None
    if client.records.sweep_taken(search_id) or client.records.exists(search_id):
        raise SpecError([f"id: a sweep, search or job {search_id!r} already exists"], "search")
    store = open_client_store(client.settings.storage_url)
    client._refuse_taken(store, [trial_id(search_id, found.size, n) for n in range(1, found.size + 1)], "search")
    shipped = client._shipper(store).ship(parsed)  # once: every trial's spec names the same archive
    warn_if_local(store, stacklevel=4)  # (once the search will be stored: not before a refusal)
    if not searches.create(client.records.redis, search_id, {
            "spec": shipped.model_dump_json(), "search": found.model_dump_json(by_alias=True, exclude_none=True),
            "monitor": parsed.checkpoint.monitor, "mode": parsed.monitor_mode, "unit": unit, "end": str(end),
            "storage_url": store.url, "overrides": json.dumps(wanted, default=str), **client._submitter_field()}):
        raise SpecError([f"id: a sweep or search {search_id!r} already exists"], "search")
    client.search_driver(search_id).advance()
    return search_id
