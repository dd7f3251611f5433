"""The run's summary ("the loop note"): best checkpoint and why, curves' meaning, stability.

Pure analysis of the metrics rows, in the task's own metrics (every ``val_NAME`` a row has); no
I/O. Rows are validations: one per epoch, or per ``eval_every_steps`` in a step-based run, where
places are named by step rather than epoch.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Optional

from baton.schemas.metrics import val_metrics

SPIKE_FACTOR = 10.0
"""A gradient-norm spike: an epoch's largest pre-clip norm above this multiple of both that epoch's
mean norm and the median of all epochs' mean norms (norms shrink as a run converges, so neither
alone is a fair yardstick)."""
OVERFIT_EPOCHS = 2
"""Consecutive epochs of rising validation loss with falling training loss that count as overfitting."""


def _where(row: dict, by_step: bool) -> str:
    """A row's place: by step in a step-based run, by epoch otherwise."""
    return f"step {row['step']}" if by_step else f"epoch {row['epoch']}"


def _first_nonfinite(rows: list[dict]) -> Optional[dict]:
    before = 0
    for row in rows:
        if row["nonfinite_steps"] > before:
            return row
        before = row["nonfinite_steps"]
    return None


def _grad_spikes(rows: list[dict]) -> list[dict]:
    means = [r["grad_norm"] for r in rows if math.isfinite(r["grad_norm"])]
    if not means:
        return []
    median = statistics.median(means)
    return [{"epoch": r["epoch"], "step": r["step"], "grad_norm_max": r["grad_norm_max"], "median_grad_norm": median}
            for r in rows if median > 0 and r["grad_norm_max"] > SPIKE_FACTOR * max(median, r["grad_norm"])]


def _overfitting_from(rows: list[dict]) -> Optional[dict]:
    """The first row of a streak of rising validation loss with falling training loss."""
    if not rows or "val_loss" not in rows[0]:
        return None
    streak = 0
    for i, (prev, row) in enumerate(zip(rows, rows[1:])):
        if row["val_loss"] > prev["val_loss"] and row["train_loss"] < prev["train_loss"]:
            streak += 1
            if streak >= OVERFIT_EPOCHS:
                return rows[i + 2 - OVERFIT_EPOCHS]
        else:
            streak = 0
    return None


def _patterns(rows: list[dict], by_step: bool) -> list[tuple[int, str]]:
    found = []
    row = _first_nonfinite(rows)
    if row is not None:
        found.append((row["step"], f"non-finite training loss (steps skipped) first in {_where(row, by_step)}"))
    spikes = _grad_spikes(rows)
    if spikes:
        spike = next(r for r in rows if r["step"] == spikes[0]["step"])
        found.append((spike["step"], f"gradient-norm spike in {_where(spike, by_step)} "
                                     f"({spikes[0]['grad_norm_max']:.3g} vs median {spikes[0]['median_grad_norm']:.3g})"))
    row = _overfitting_from(rows)
    if row is not None:
        found.append((row["step"], f"overfitting from {_where(row, by_step)}: validation loss rising while training loss falls"))
    if len(rows) >= 2 and rows[-1]["train_loss"] >= rows[0]["train_loss"]:
        found.append((rows[-1]["step"], "training loss did not fall over the run"))
    return sorted(found)


def _curves(rows: list[dict]) -> str:
    first, last = rows[0], rows[-1]
    parts = [f"train_loss {first['train_loss']:.4g} -> {last['train_loss']:.4g}"]
    parts += [f"{name} {first.get(name, math.nan):.4g} -> {value:.4g}" for name, value in val_metrics(last).items()]
    return "curves: " + ", ".join(parts)


@dataclass(frozen=True)
class Provenance:
    """Where a report's numbers come from, besides the rows: the ``attempts`` the job took, the object
    key of its best checkpoint (``best_key``, the manifest's ``best.key``), the checkpoint whose weights
    best.safetensors holds (``weights_key``; None: there is none) and why that is not the best one when
    it is not (``weights_note``), and where the state was loaded onto another number of ranks
    (``reshards``: the run is then not bit-exact with one that was not)."""

    attempts: int
    best_key: Optional[str] = None
    weights_key: Optional[str] = None
    weights_note: Optional[str] = None
    reshards: tuple[str, ...] = ()


def build_report(job_id: str, spec: dict, rows: list[dict], best: dict, sources: Provenance) -> dict[str, Any]:
    """The report of a finished job: what was trained, the best checkpoint and why, the last validation,
    how stable the run was, what checkpointing cost, and a note for people."""
    if not rows:
        raise ValueError("no validation rows: nothing to report")
    by_step = (spec.get("loop") or {}).get("max_steps") is not None
    last = rows[-1]
    best_row = next((r for r in rows if r["step"] == best["step"]), last)
    patterns = _patterns(rows, by_step)
    why = _why_best(best, best_row, last, by_step)
    stable = not patterns or all("overfitting" in p for _, p in patterns)
    note = [
        f"best checkpoint: {why}",
        _curves(rows),
        "stable enough to trust" if stable else "not stable: see failure patterns",
        f"first failure pattern: {patterns[0][1]}" if patterns else "no failure pattern seen",
    ]
    if sources.weights_note is not None:
        note.append(f"best weights: {sources.weights_note}")
    note.extend(sources.reshards)
    code = spec.get("code") or {}
    if code.get("digest"):
        note.append(f"trained with shipped code {code['digest']}" + (f" and packages {', '.join(code['pip'])}"
                                                                      if code.get("pip") else ""))
    kept = best["value"] is not None
    return {
        "job_id": job_id,
        "name": spec.get("name"),
        "epochs": last["epoch"],
        "validations": len(rows),
        "steps": last["step"],
        "monitor": best["metric"],
        "best": {**best, "step": best_row["step"] if kept else None,
                 **val_metrics(best_row), "train_loss": best_row["train_loss"],
                 "checkpoint": sources.best_key if kept else None, "why": why,
                 "weights": sources.weights_key, "weights_note": sources.weights_note},
        "last": {"epoch": last["epoch"], "step": last["step"], "train_loss": last["train_loss"], **val_metrics(last)},
        "stability": _stability(rows, stable),
        "failure_patterns": [p for _, p in patterns],
        "first_failure_pattern": patterns[0][1] if patterns else None,
        "checkpoints": _checkpoint_totals(rows),
        "attempts": sources.attempts,
        "resharded": list(sources.reshards),
        "code": {"digest": code.get("digest"), "pip": list(code.get("pip") or ())} if code else None,
        "note": note,
    }


def _why_best(best: dict, best_row: dict, last: dict, by_step: bool) -> str:
    """Why the best checkpoint is the one it is, and how the last validation compares."""
    metric = best["metric"]
    if best["value"] is None:
        return f"none: {metric} was never finite, so no checkpoint was kept as best"
    place = _where(best_row, by_step) + ("" if by_step else f" (step {best_row['step']})")
    why = (f"{place} has the "
           f"{'lowest' if best['mode'] == 'min' else 'highest'} {metric} = {best['value']:.6g}"
           f"{' on the validation set' if metric.startswith('val_') else ''}")
    if best_row["step"] != last["step"]:
        return why + f"; the last validation ({_where(last, by_step)}) reached {last[metric]:.6g}, so best and last differ"
    return why + "; it is also the last validation"


def _stability(rows: list[dict], stable: bool) -> dict[str, Any]:
    overfit = _overfitting_from(rows)
    return {
        "stable": stable,
        "nonfinite_steps": rows[-1]["nonfinite_steps"],
        "grad_norm_spikes": _grad_spikes(rows),
        "overfitting_from_epoch": overfit["epoch"] if overfit else None,
        "overfitting_from_step": overfit["step"] if overfit else None,
    }


def _checkpoint_totals(rows: list[dict]) -> dict[str, Any]:
    return {
        "committed": sum(r.get("ckpt_count", 0) for r in rows),
        "skipped_in_flight": max((r.get("ckpt_skipped", 0) for r in rows), default=0),
        "stall_s": sum(r.get("ckpt_stall_s", 0.0) for r in rows),
        "write_s": sum(r.get("ckpt_write_s", 0.0) for r in rows),
    }
