"""The run's summary ("the loop note"): best checkpoint and why, curves' meaning, stability.

Pure analysis of the metrics rows; no I/O.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

SPIKE_FACTOR = 10.0
"""A gradient-norm spike: an epoch's largest pre-clip norm above this multiple of both that epoch's
mean norm and the median of all epochs' mean norms (norms shrink as a run converges, so neither
alone is a fair yardstick)."""
OVERFIT_EPOCHS = 2
"""Consecutive epochs of rising validation loss with falling training loss that count as overfitting."""


def _first_nonfinite(rows: list[dict]) -> Optional[int]:
    before = 0
    for row in rows:
        if row["nonfinite_steps"] > before:
            return row["epoch"]
        before = row["nonfinite_steps"]
    return None


def _grad_spikes(rows: list[dict]) -> list[dict]:
    means = [r["grad_norm"] for r in rows if math.isfinite(r["grad_norm"])]
    if not means:
        return []
    median = statistics.median(means)
    return [{"epoch": r["epoch"], "grad_norm_max": r["grad_norm_max"], "median_grad_norm": median}
            for r in rows if median > 0 and r["grad_norm_max"] > SPIKE_FACTOR * max(median, r["grad_norm"])]


def _overfitting_from(rows: list[dict]) -> Optional[int]:
    streak = 0
    for prev, row in zip(rows, rows[1:]):
        if row["val_loss"] > prev["val_loss"] and row["train_loss"] < prev["train_loss"]:
            streak += 1
            if streak >= OVERFIT_EPOCHS:
                return row["epoch"] - OVERFIT_EPOCHS + 1
        else:
            streak = 0
    return None


def _patterns(rows: list[dict]) -> list[tuple[int, str]]:
    found = []
    epoch = _first_nonfinite(rows)
    if epoch is not None:
        found.append((epoch, f"non-finite training loss (steps skipped) first in epoch {epoch}"))
    spikes = _grad_spikes(rows)
    if spikes:
        found.append((spikes[0]["epoch"], f"gradient-norm spike in epoch {spikes[0]['epoch']} "
                                         f"({spikes[0]['grad_norm_max']:.3g} vs median {spikes[0]['median_grad_norm']:.3g})"))
    epoch = _overfitting_from(rows)
    if epoch is not None:
        found.append((epoch, f"overfitting from epoch {epoch}: validation loss rising while training loss falls"))
    if len(rows) >= 2 and rows[-1]["train_loss"] >= rows[0]["train_loss"]:
        found.append((rows[-1]["epoch"], "training loss did not fall over the run"))
    return sorted(found)


def build_report(job_id: str, spec: dict, rows: list[dict], best: dict, resumed_attempts: int) -> dict[str, Any]:
    if not rows:
        raise ValueError("no validation rows: nothing to report")
    last = rows[-1]
    best_row = next((r for r in rows if r["epoch"] == best["epoch"]), last)
    patterns = _patterns(rows)
    metric = best["metric"]
    if best["value"] is None:
        why = f"none: {metric} was never finite, so no checkpoint was kept as best"
    else:
        why = (f"epoch {best_row['epoch']} (step {best_row['step']}) has the "
               f"{'lowest' if best['mode'] == 'min' else 'highest'} {metric} = {best['value']:.6g} on the held-out split")
    if best["value"] is not None and best_row["epoch"] != last["epoch"]:
        why += f"; the last epoch ({last['epoch']}) reached {last[metric]:.6g}, so best and last differ"
    stable = not patterns or all("overfitting" in p for _, p in patterns)
    note = [
        f"best checkpoint: {why}",
        f"curves: train loss {rows[0]['train_loss']:.4g} -> {last['train_loss']:.4g}, "
        f"val loss {rows[0]['val_loss']:.4g} -> {last['val_loss']:.4g}, val accuracy {last['val_accuracy']:.4f} at the end",
        "stable enough to trust" if stable else "not stable: see failure patterns",
        f"first failure pattern: {patterns[0][1]}" if patterns else "no failure pattern seen",
    ]
    return {
        "job_id": job_id,
        "name": spec.get("name"),
        "epochs": len(rows),
        "steps": last["step"],
        "best": {**best, "step": best_row["step"] if best["value"] is not None else None,
                 "val_loss": best_row["val_loss"], "val_accuracy": best_row["val_accuracy"],
                 "checkpoint": "checkpoints/best.pt" if best["value"] is not None else None, "why": why},
        "last": {k: last[k] for k in ("epoch", "step", "train_loss", "val_loss", "val_accuracy")},
        "stability": {
            "stable": stable,
            "nonfinite_steps": last["nonfinite_steps"],
            "grad_norm_spikes": _grad_spikes(rows),
            "overfitting_from_epoch": _overfitting_from(rows),
        },
        "failure_patterns": [p for _, p in patterns],
        "first_failure_pattern": patterns[0][1] if patterns else None,
        "checkpoints": {
            "committed": sum(r.get("ckpt_count", 0) for r in rows),
            "skipped_in_flight": max((r.get("ckpt_skipped", 0) for r in rows), default=0),
            "stall_s": sum(r.get("ckpt_stall_s", 0.0) for r in rows),
            "write_s": sum(r.get("ckpt_write_s", 0.0) for r in rows),
        },
        "attempts": resumed_attempts,
        "note": note,
    }
