"""How jobs look in a terminal: one job in detail, many as a table, a progress line."""
from __future__ import annotations

import datetime as dt
from typing import Optional

from baton.schemas.status import JobStatus


def _when(stamp: Optional[float]) -> str:
    return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S") if stamp else "-"


def _num(value: Optional[float], fmt: str = ".4f") -> str:
    return "-" if value is None else format(value, fmt)


def _epoch(s: JobStatus) -> str:
    if s.epoch is None:
        return f"-/{s.epochs}" if s.epochs else "-"
    return f"{s.epoch}/{s.epochs}" if s.epochs else str(s.epoch)


def progress_line(s: JobStatus) -> str:
    steps = f"{s.step}/{s.total_steps}" if s.total_steps else "-"
    epoch = _epoch(s)
    line = (f"{s.id} {s.shown_state} attempt {s.attempt} on {s.worker or '-'}: epoch {epoch} step {steps} "
            f"loss {_num(s.loss)} {_num(s.samples_per_s, '.0f')} samples/s")
    return f"{line}; {s.waiting}" if s.waiting else line


def _metric_rows(s: JobStatus) -> list[tuple[str, str]]:
    """The last validation's metrics, the monitored one first; "-" for the monitor before any validation."""
    metrics = dict(s.metrics) if s.metrics is not None else {
        k: v for k, v in (("val_loss", s.val_loss), ("val_accuracy", s.val_accuracy)) if v is not None}
    names = sorted(metrics, key=lambda name: name != s.monitor)
    if s.monitor is not None and s.monitor not in metrics and s.monitor.startswith("val_"):
        names.insert(0, s.monitor)
    return [(f"{name} (monitored)" if name == s.monitor else name, _num(metrics.get(name))) for name in names]


def _training_process(s: JobStatus) -> str:
    if s.pid is None or s.worker is None or s.state.value != "running":
        return "-"
    return f"pid {s.pid} on {s.worker.partition('@')[2] or s.worker}"


def details(s: JobStatus) -> str:
    rows = [
        ("id", s.id), ("name", s.name), ("state", s.shown_state), ("queue", s.queue),
        ("team", s.team), ("priority", str(s.priority)), ("submitted by", s.submitted_by or "-"),
        ("attempt", f"{s.attempt} (lost {s.lost} of max {s.max_attempts})"),
        ("worker" if s.state.value == "running" else "last worker", s.worker or "-"),
        ("training process", _training_process(s)),
        ("epoch", _epoch(s)),
        ("step", f"{s.step}/{s.total_steps}" if s.total_steps else "-"),
        ("loss", _num(s.loss)), *_metric_rows(s),
        ("latest checkpoint", s.latest_checkpoint or "-"),
        ("best checkpoint", f"{s.best_checkpoint} ({s.monitor or 'monitored'} {_num(s.best_value)})"
         if s.best_checkpoint else "-"),
        ("resumed from step", "-" if s.resumed_from is None else str(s.resumed_from)),
        ("storage", s.storage_url or "-"), ("created", _when(s.created_at)), ("updated", _when(s.updated_at)),
    ]
    if s.position is not None:
        rows.append(("position", f"{s.position} in queue {s.queue}"))
    if s.waiting:
        rows.append(("waiting", s.waiting))
    if s.starts_in_s is not None:
        rows.append(("estimated start", f"in {_duration(s.starts_in_s)}"))
    if s.pause_at is not None and not s.state.terminal:
        rows.append(("pauses at", f"the end of epoch {s.pause_at}" if s.epochs else
                     f"the first validation at or past step {s.pause_at}"))
    if s.last_event and not s.state.terminal:
        rows.append(("last event", s.last_event))
    if s.error and not s.failure:  # (the failure's first line is the error)
        rows.append(("error", s.error))
    width = max(18, *(len(k) for k, _ in rows))
    text = "\n".join(f"{k:>{width}}: {v}" for k, v in rows)
    if s.failure or s.traceback:  # (the cause and your own frames; the whole traceback is in `baton logs`)
        text += "\n\n" + (s.failure or s.traceback or "").rstrip()
    return text


def table(statuses: list[JobStatus]) -> str:
    width = max([10, *(len(s.shown_state) for s in statuses)])  # ("queued (yielded)" is wider than the others)
    header = f"{'ID':<40} {'STATE':<{width}} {'ATT':>3} {'STEP':>13} {'VAL_LOSS':>9} {'WORKER':<24}"
    lines = [header]
    for s in statuses:
        steps = f"{s.step}/{s.total_steps}" if s.total_steps else "-"
        lines.append(f"{s.id:<40} {s.shown_state:<{width}} {s.attempt:>3} {steps:>13} {_num(s.val_loss):>9} "
                     f"{s.worker or '-':<24}")
    return "\n".join(lines)


def events_table(events: list) -> str:
    """A job's history (``storage.records.events.Event``), oldest first, one event a line."""
    rows = [["TIME", "ATTEMPT", "EVENT", "STEP", "WORKER", "WHAT"]]
    rows += [[_when(e.t), str(e.attempt), e.kind, "-" if e.step is None else str(e.step), e.worker or "-", e.text]
             for e in events]
    return "\n".join(_columns(rows))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def queue_table(view) -> str:
    """One queue (``baton.jobs.pool.QueueView``): its waiting jobs in start order, its running jobs, and
    its teams' slots against their quotas."""
    state = view.state
    drained = sorted(view.drained)
    lines = [f"queue {view.queue}: {len(state.waiting)} waiting, {len(view.running)} running, "
             f"{len(view.workers)} live worker(s)" + (f", drained: {', '.join(drained)}" if drained else "")]
    if state.waiting:
        lines += ["", "waiting, in the order they will start:"]
        lines += _columns([["POS", "JOB", "TEAM", "BY", "PRIORITY", "WHY IT WAITS"]] + [
            [str(w.position), w.job_id + (" (yielded)" if w.job_id in view.yielded else ""), w.team,
             w.submitted_by or "-", str(w.priority), view.reasons.get(w.job_id, "")] for w in state.waiting])
    if view.running:
        lines += ["", "running:"]
        lines += _columns([["JOB", "WORKER", "TEAM", "BY", "PRIORITY", "STEP"]] + [
            [s.id, s.worker or "-", s.team, s.submitted_by or "-", str(s.priority),
             f"{s.step}/{s.total_steps}" if s.total_steps else "-"]
            for s in view.running])
    teams = sorted(set(state.quotas) | set(state.usage))
    if state.quotas and teams:
        lines += ["", "teams:"]
        lines += _columns([["TEAM", "SLOTS IN USE", "QUOTA"]] + [
            [team, str(state.usage.get(team, 0)), str(state.quotas[team]) if team in state.quotas else "-"]
            for team in teams])
    return "\n".join(lines)


def _value(value: object) -> str:
    return format(value, ".4g") if isinstance(value, float) else str(value)


def sweep_table(entries: list) -> str:
    """A sweep's jobs (``baton.jobs.sweeps.SweepEntry``, best first): the grid values that differ, the
    state and the best monitored value, with its direction."""
    if not entries:
        return "no jobs"
    axes = [p for p in entries[0].status.overrides or {}
            if len({repr((e.status.overrides or {}).get(p)) for e in entries}) > 1]
    monitor, mode = entries[0].monitor, entries[0].mode
    best = f"BEST {monitor} ({mode})"
    cells = [[e.status.id, e.status.state.value, *(_value((e.status.overrides or {}).get(p, "-")) for p in axes),
              f"{e.status.step}/{e.status.total_steps}" if e.status.total_steps else "-", _num(e.best_value)]
             for e in entries]
    return "\n".join(_columns([["ID", "STATE", *axes, "STEP", best], *cells]))


def search_table(results) -> str:
    """A search (``baton.searches.results.SearchResults``): its rungs, then one row per trial (its
    parameters, standing, metric at each rung and best value), then the best trial once it has finished."""
    r = results
    unit = r.unit[:-1]
    rungs = (f"compared at {unit}{'s' if len(r.rungs) > 2 else ''} {', '.join(map(str, r.rungs[:-1]))}, "
             if len(r.rungs) > 1 else "no halving, ")
    head = (f"search {r.search_id}: {r.state}; {r.monitor} ({r.mode}) {rungs}the run ends at {unit} {r.rungs[-1]}; "
            f"{len(r.trials)} trials, {r.search_steps} steps trained")
    axes = list(r.trials[0].params) if r.trials else []
    rungs = r.rungs[:-1]
    cells = [[str(t.number), t.status.id, t.standing, *(_value(t.params.get(p, "-")) for p in axes),
              *(_num(t.rung_values.get(at)) for at in rungs), _num(t.status.best_value)] for t in r.trials]
    table = _columns([["TRIAL", "ID", "STANDING", *axes, *(f"@{unit} {at}" for at in rungs), "BEST"], *cells])
    best = next((t for t in r.trials if t.status.id == r.best), None)
    tail = [f"best: {best.status.id} ({r.monitor} {_num(best.status.best_value)})"] if best is not None else []
    tail += [f"failed: {r.error}"] if r.error else []
    return "\n".join([head, *table, *tail])


def quota_table(rows: list[list[str]]) -> str:
    """``baton quota list``: one row per (queue, team, quota, slots in use)."""
    return "\n".join(_columns([["QUEUE", "TEAM", "QUOTA", "IN USE"], *rows]))


def users_table(principals: list) -> str:
    """``baton users list``: one row per principal (``baton.schemas.principals.Principal``); no tokens."""
    return "\n".join(_columns([["USER", "ROLE", "TEAMS", "KIND", "CREATED"]] + [
        [p.name, p.role.value, ",".join(p.teams) or "-", "service" if p.service else "person", _when(p.created_at)]
        for p in principals]))
