"""The Python surface: ``JobClient`` and the ``Job`` handles it returns.

    client = JobClient()                 # BATON_REDIS_URL, BATON_STORAGE_URL from the environment
    job = client.submit("job.yaml")      # or a JobSpec or a dict; validated before anything is queued
    job.status(); job.wait(progress=True); job.metrics(); job.cancel(); job.set_priority(10)
    job.download("out/", which="best")   # best | latest | final
    job.logs(); job.follow_logs()        # the job's own output, every attempt (or attempt=N)
    job.events()                         # its history: claimed, yielded, lost, resumed, ended...
    client.submit("job.yaml", overrides={"optimizer.lr": 1e-3})       # or ["optimizer.lr=1e-3"]
    sweep = client.sweep("job.yaml", {"optimizer.lr": [1e-3, 3e-3], "seed": [1, 2, 3]})
    client.sweep_results(sweep.id)       # its jobs, best monitored value first (a search's: its results)
    search = client.search("job.yaml", "search.yaml")                 # sampled trials, losers stopped at rungs
    client.search_results(search.id)     # each trial's standing and metric per rung, and the best
"""
from __future__ import annotations

import copy
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from baton.schemas.errors import JobNotFound, LocalStoreWarning, OverLimit, SpecError
from baton.schemas.overrides import Overrides, normalize, normalize_grid
from baton.schemas.settings import BatonSettings
from baton.schemas.spec import NAME_PATTERN, JobSpec
from baton.schemas.status import JobState, JobStatus
from baton.storage.stores.base import ObjectStore
from baton.storage.layout import JobPaths, check_job_id, new_job_id
from baton.storage.stores.open import open_client_store

from baton.storage.records.creation import create_job
from baton.storage.records.job_records import JobRecords
from baton.storage.records import searches as search_records
from baton.storage.records import teams as team_records
from baton.storage.records.connection import connect
from baton.jobs.code_ship import Shipper, code_dir, importable, not_the_servers
from baton.jobs.job import Job
from baton.jobs.specfile import SpecSource, load_spec, read_raw, with_overrides
from baton.jobs.sweeps import SweepEntry, plan, rank
from baton.jobs.pool import QueueView, check_quota, drain, queue_views
from baton.jobs.roles import may_submit, within_limit
from baton.schemas.principals import Principal

if TYPE_CHECKING:
    from baton.jobs.recover import Recovered
    from baton.schemas.audit import AuditEntry
    from baton.storage.records.principals import Principals
    from baton.searches.driver import Driver
    from baton.searches.results import SearchResults



def _refuse_code_axes(paths: list[str]) -> None:
    named = [path for path in paths if path == "code" or path.startswith("code.") and path != "code.digest"]
    if named:
        raise SpecError([not_the_servers(path) for path in named])


@dataclass(frozen=True)
class Sweep:
    """The jobs one ``JobClient.sweep`` queued, in grid order."""

    id: str
    jobs: list[Job]


def warn_if_local(store: ObjectStore, stacklevel: int = 3) -> None:
    if store.url.startswith("file://"):
        warnings.warn(f"the job is stored under {store.url}, a directory of this machine: only workers here whose "
                      "BATON_STORAGE_URL is that directory will run it (the others pass it on); to queue jobs for "
                      "workers elsewhere, use a store they all share (s3://...)", LocalStoreWarning, stacklevel=stacklevel)


class JobClient:
    def __new__(cls, redis_url: Optional[str] = None, storage_url: Optional[str] = None) -> Any:
        """With BATON_SERVER_URL set and no Redis or store named here, the client of the pool's server
        (``baton.jobs.server_client.ServerClient``: the same calls, each a request the server checks)."""
        if cls is JobClient and redis_url is None and storage_url is None:
            from baton.jobs.server_client import ServerClient, server_settings

            settings = server_settings()
            if settings is not None:
                return ServerClient(settings)
        return super().__new__(cls)

    def __init__(self, redis_url: Optional[str] = None, storage_url: Optional[str] = None):
        overrides = {k: v for k, v in (("redis_url", redis_url), ("storage_url", storage_url)) if v}
        self.settings = BatonSettings.model_validate(overrides)
        self.records = JobRecords(connect(self.settings))
        self._celery = None
        self._principal: Optional[Principal] = None  # whom the pool's server acts for (``acting_for``): None, nobody proved

    def acting_for(self, who: Principal) -> "JobClient":
        """This client, submitting for the principal ``who`` (the pool's server, which proved who it is): each
        job it creates records ``submitted_by``, and a job, sweep point or search of a team ``who`` may not
        submit to is refused as one above its team's limit is. Shares this client's connections."""
        other = copy.copy(self)
        other._principal = who
        return other

    def _submitter_field(self) -> dict[str, str]:
        return {"submitted_by": self._principal.name} if self._principal is not None else {}

    def _check_limits(self, specs: "Sequence[JobSpec]") -> None:
        """OverLimit (nothing queued) naming the limit when a spec's priority is above its team's max priority
        (``baton teams set``), whoever submits, or its team is not one the principal acted for may submit to."""
        limits = team_records.limits(self.records.redis)
        problems = sorted({f"resources.priority: {problem}" for spec in specs if (problem := within_limit(
            spec.resources.priority, spec.resources.team, limits.get(spec.resources.team))) is not None})
        if self._principal is not None:
            who = self._principal
            problems += sorted({f"resources.team: {problem}" for spec in specs
                                if (problem := may_submit(who, spec.resources.team)) is not None})
        if problems:
            raise OverLimit(problems)

    def _publish(self, job_id: str, attempt: int) -> None:
        from baton.storage.records.messages import make_app, publish_run  # the Celery app only, never the loop

        if self._celery is None:
            self._celery = make_app(self.settings)
        celery = self._celery
        self.records.publish_marked(job_id, attempt, lambda job, n, queue: publish_run(celery, job, n, queue))

    def submit(self, spec: SpecSource, job_id: Optional[str] = None, overrides: Overrides = None,
               code: "str | Path | None" = None, pause_at: Optional[int] = None) -> Job:
        """Validate, store the spec, create the record, queue attempt 1. SpecError (nothing queued)
        if the spec is invalid. ``overrides`` (``{"optimizer.lr": 1e-3}`` or ``["optimizer.lr=1e-3"]``)
        are applied to the spec's raw mapping before it is validated. ``code``: a directory of your code
        to ship with the job (as ``code.dir`` in the spec), packed and stored once under its digest.
        ``pause_at``: the job pauses at the end of this epoch (an epoch-based run: ``loop.epochs``) or at the
        first validation at or past this step (a step-based run: ``loop.max_steps``); ``Job.resume`` goes on."""
        if pause_at is not None and pause_at < 1:
            raise SpecError([f"pause_at: must be 1 or more (got {pause_at})"])
        wanted = normalize(overrides)
        parsed = load_spec(spec, self.settings.allowed_prefixes, wanted, code)
        if pause_at is not None and parsed.resources.nodes > 1:
            raise SpecError([f"pause_at: a job of {parsed.resources.nodes} nodes cannot pause (one node only)"])
        self._check_limits([parsed])
        try:
            job_id = check_job_id(job_id or new_job_id(parsed.name))
        except ValueError as exc:
            raise SpecError([f"job_id: {exc}"]) from None
        store = open_client_store(self.settings.storage_url)
        self._refuse_taken(store, [job_id])
        parsed = self._shipper(store).ship(parsed)
        warn_if_local(store)  # (once the job will be stored: not before a refusal)
        self._create(store, job_id, parsed, {**({"overrides": json.dumps(wanted, default=str)} if wanted else {}),
                                             **({"pause_at": str(pause_at)} if pause_at is not None else {})})
        self._publish(job_id, 1)
        return Job(self, job_id)

    def sweep(self, spec: SpecSource, grid: "Mapping[str, Sequence[Any]] | Sequence[str]",
              overrides: Overrides = None, sweep_id: Optional[str] = None, code: "str | Path | None" = None) -> "Sweep":
        """Queue one job per point of ``grid`` (``{"optimizer.lr": [1e-3, 3e-3], "seed": [1, 2]}`` or
        ``["optimizer.lr=1e-3,3e-3", "seed=1,2"]``), each the spec with that point's overrides. Every
        point is validated first: one invalid point raises SpecError and nothing is queued."""
        raw = read_raw(spec)
        given = raw.get("name") if isinstance(raw, dict) else None
        name = given if isinstance(given, str) and re.match(NAME_PATTERN, given) else "job"  # an invalid one: plan() says so
        try:
            sweep_id = check_job_id(sweep_id or new_job_id(f"{name}-sweep"))
        except ValueError as exc:
            raise SpecError([f"sweep_id: {exc}"]) from None
        wanted = {**normalize(overrides), **({"code.dir": str(code)} if code is not None else {})}
        axes = normalize_grid(grid)
        if self._principal is not None:  # (the server's directories are no grid's to name)
            _refuse_code_axes(list(axes) + list(wanted))
        with importable(code_dir(with_overrides(raw, wanted)) if self._principal is None else None):
            jobs = plan(raw, axes, sweep_id, self.settings.allowed_prefixes, wanted)
        self._check_limits([job.spec for job in jobs])
        if self.records.sweep_taken(sweep_id):
            raise SpecError([f"sweep_id: a sweep or search {sweep_id!r} already exists"])
        store = open_client_store(self.settings.storage_url)
        self._refuse_taken(store, [job.job_id for job in jobs])
        shipper = self._shipper(store)  # one archive for every trial that ships the same directory
        shipped = [shipper.ship(job.spec) for job in jobs]
        warn_if_local(store)
        self.records.add_to_sweep(sweep_id, [job.job_id for job in jobs])
        for job, spec in zip(jobs, shipped):
            self._create(store, job.job_id, spec, {"sweep": sweep_id, "overrides": json.dumps(job.overrides, default=str)})
        for job in jobs:
            self._publish(job.job_id, 1)
        return Sweep(sweep_id, [Job(self, job.job_id) for job in jobs])

    def sweep_results(self, sweep_id: str) -> "list[SweepEntry] | SearchResults":
        """A grid sweep's jobs, best monitored value first (min or max by each spec's checkpoint monitor;
        jobs without a best value yet come last); a search's results (``search_results``) when the id is a
        search's. JobNotFound for an unknown sweep."""
        if search_records.exists(self.records.redis, sweep_id):
            return self.search_results(sweep_id)
        entries = []
        for job_id in self.records.sweep_ids(sweep_id):
            try:
                raw = self.records.raw(job_id)
            except JobNotFound:
                continue
            spec = JobSpec.model_validate_json(raw["spec"])
            entries.append(SweepEntry(JobStatus.model_validate(raw), spec.checkpoint.monitor, spec.monitor_mode))
        if not entries:
            raise JobNotFound(f"no sweep {sweep_id!r}")
        return rank(entries)

    def search(self, spec: SpecSource, search: "str | Path | dict", overrides: Overrides = None,
               search_id: Optional[str] = None, code: "str | Path | None" = None) -> "Sweep":
        """Start a search over ``spec`` (a search file or mapping: ``baton.schemas.search``); its trials are
        ordinary jobs, queued round by round, paused at rungs and promoted by successive halving as they
        get there. SpecError (nothing queued) if the spec or the search is invalid. The trials queued so far."""
        from baton.jobs.search_submit import submit_search

        search_id = submit_search(self, spec, search, overrides, search_id, code)
        return Sweep(search_id, [Job(self, job_id) for job_id in self.records.sweep_ids(search_id)])

    def cancel_sweep(self, sweep_id: str) -> dict[str, str]:
        """Cancel a sweep or a search: a running search takes no further step (its state: cancelled), and each of
        its jobs is cancelled as ``Job.cancel`` does (the trials an ended search stopped stay paused, resumable);
        each job's answer by its id. JobNotFound for an unknown id."""
        from baton.searches.driver import own_trials

        redis = self.records.redis
        job_ids, ended = self.records.sweep_ids(sweep_id), False
        if search_records.exists(redis, sweep_id):
            ended = not search_records.stop(redis, sweep_id)  # first: a decider creating a trial after this cancels it
            job_ids += [job_id for job_id in own_trials(redis, sweep_id) if job_id not in job_ids]
        elif not job_ids:
            raise JobNotFound(f"no sweep or search {sweep_id!r}")
        answers = {}
        for job_id in job_ids:
            state = self.records.state(job_id)
            if state is not None and (state.terminal or ended and state is JobState.paused):
                answers[job_id] = f"already {'stopped by its search' if state is JobState.paused else state.value}"
            else:
                answers[job_id] = self.records.cancel(job_id)
        return answers

    def search_results(self, search_id: str) -> "SearchResults":
        """Each trial's parameters, state, standing and metric at each rung, and the best trial (once the
        search has finished). JobNotFound for an unknown search."""
        from baton.searches.results import search_results

        try:
            return search_results(self.records.redis, search_id)
        except JobNotFound as exc:
            if self.records.sweep_ids(search_id):
                raise JobNotFound(f"{exc}; {search_id!r} is a grid sweep: baton list --sweep {search_id}") from None
            raise

    def search_report(self, search_id: str, dest: "str | Path") -> list[Path]:
        """Write the search's report into ``dest``: report.md (its table and best trial) and rungs.png (each
        trial's metric across the rungs); the files written. JobNotFound for an unknown search."""
        from baton.searches.report import write_report

        return write_report(self.search_results(search_id), dest)

    def search_driver(self, search_id: str) -> "Driver":
        from baton.searches.driver import Driver

        return Driver(self.records.redis, search_id, self._publish, open_client_store)

    def _shipper(self, store: ObjectStore) -> Shipper:
        """What packs a spec's code.dir; for the pool's server (``acting_for``) none: the directory would be one of
        the server's machine, not the user's (the user's client packs and uploads it)."""
        return Shipper(store, int(self.settings.code_limit_mb * 1e6), local_dirs=self._principal is None)

    def _refuse_taken(self, store: ObjectStore, job_ids: list[str], what: str = "job spec") -> None:
        from baton.searches.driver import searches_claiming

        existing = [job_id for job_id in job_ids if self.records.exists(job_id) or store.exists(JobPaths(job_id).spec)]
        taken = [f"id: a job {job_id!r} already exists" for job_id in existing]
        taken += [f"id: {job_id!r} is a trial's of the running search {search_id!r}" for job_id, search_id
                  in searches_claiming(self.records.redis, [j for j in job_ids if j not in existing]).items()]
        if taken:
            raise SpecError(taken, what)

    def _create(self, store: ObjectStore, job_id: str, parsed: JobSpec, extra: dict[str, str]) -> None:
        create_job(self.records, store, job_id, parsed, {**extra, **self._submitter_field()})

    def recover(self, job_id: Optional[str] = None) -> "list[Recovered]":
        """Rebuild records lost with Redis from object storage (``job_id``, or every job the store
        holds) and queue each unfinished one again; see ``baton.jobs.recover``."""
        from baton.jobs.recover import recover_jobs

        store = open_client_store(self.settings.storage_url)
        return recover_jobs(self.records, store, self._publish, None if job_id is None else [job_id])

    def job(self, job_id: str) -> Job:
        self.records.raw(job_id)  # JobNotFound if it does not exist
        return Job(self, job_id)

    def queue(self, name: Optional[str] = None) -> "list[QueueView]":
        """Queue ``name`` (every queue when None): its waiting jobs in the order they will start, with why
        each waits; its running jobs; each team's use of its worker slots and its quota."""
        return queue_views(self.records, name)

    def set_quota(self, team: str, queue: str, slots: int) -> list[str]:
        """Guarantee ``team`` ``slots`` worker slots of ``queue`` (it may borrow idle ones beyond). The warnings
        (a team that no job or quota named before, a queue that no live worker serves: a misspelling?)."""
        from baton.storage.records import names

        check_quota(queue, team, slots)
        known = names.teams(self.records.redis)
        self.records.pool.set_quota(queue, team, slots)
        warnings = [] if team in known else [f"no job or quota has named team {team!r} yet (misspelled? known "
                                             f"teams: {', '.join(known) or 'none'})"]
        if not self.records.pool.live_workers(queue):
            warnings.append(f"no live worker serves queue {queue!r} now (misspelled?)")
        return warnings

    def remove_quota(self, team: str, queue: str) -> bool:
        """Remove ``team``'s quota on ``queue``; False when it had none."""
        check_quota(queue, team)
        return self.records.pool.remove_quota(queue, team)

    def drain(self, worker: str) -> tuple[str, bool]:
        """Drain ``worker``: its job yields at its next optimizer step (checkpointed, re-queued, nothing
        lost) and it takes no other until ``undrain``. Returns its full name and whether it was not
        drained already; ValueError when no live worker has that name."""
        return drain(self.records, worker, True)

    def undrain(self, worker: str) -> tuple[str, bool]:
        """Let a drained ``worker`` take jobs again (its full name, and whether it was drained)."""
        return drain(self.records, worker, False)

    def quotas(self) -> dict[str, dict[str, int]]:
        """Every quota: queue -> team -> slots."""
        return self.records.pool.quotas()

    def usage(self, queue: str) -> dict[str, int]:
        """The worker slots each team holds on ``queue`` now."""
        return self.records.pool.usage(queue)

    def live_workers(self, queue: str) -> list[str]:
        """The live workers that serve ``queue``."""
        return self.records.pool.live_workers(queue)

    def principals(self) -> "Principals":
        """The pool's users and their tokens (``baton users``): whoever holds the Redis URL is their admin."""
        from baton.storage.records.principals import Principals

        return Principals(self.records.redis)

    def set_max_priority(self, team: str, limit: Optional[int]) -> None:
        """``team``'s max priority (None: no limit): a job above it is refused, at submit and at a change."""
        check_quota("default", team)  # (the team's name, checked as a quota's is)
        team_records.set_max_priority(self.records.redis, team, limit)

    def limits(self) -> dict[str, int]:
        """Each team's max priority, of the teams that have one."""
        return team_records.limits(self.records.redis)

    def audit(self, since: Optional[float], user: Optional[str], limit: int) -> "list[AuditEntry]":
        """The pool server's audit trail, newest first (``baton audit``)."""
        from baton.storage.records.audit import recent

        return recent(self.records.redis, since, user, limit)

    def list(self, limit: int = 100) -> list[JobStatus]:
        """The newest jobs first."""
        statuses: list[JobStatus] = []
        queues: dict = {}  # each queue's start order, read once for the listing
        for job_id in self.records.list_ids(limit):
            try:
                statuses.append(self.records.status(job_id, queues))
            except JobNotFound:
                continue
        return statuses
