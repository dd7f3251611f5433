"""curves.png: training loss step by step and at each validation, validation loss, the task's other
metrics, gradient norm and lr, by step."""
from __future__ import annotations

import io
from typing import Optional

from matplotlib.figure import Figure  # drawn straight to PNG: pyplot's backends and figure manager are not needed

from baton.schemas.metrics import val_metrics


def plot_curves(rows: list[dict], best_step: Optional[int], title: str) -> bytes:
    """curves.png's bytes (see ``figure``)."""
    fig = figure(rows, best_step, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def figure(rows: list[dict], best_step: Optional[int], title: str) -> Figure:
    """One panel per scale: the losses together, each other validation metric on its own axis (a
    perplexity of 6-10 beside an accuracy of 0.4 would flatten the accuracy into a line), and the
    gradient norm with the learning rate on a second axis, both in its legend."""
    steps = [r["step"] for r in rows]
    others = [name for name in val_metrics(rows[-1]) if name != "val_loss"]
    fig = Figure(figsize=(4.6 * (2 + len(others)), 4))
    axes = fig.subplots(1, 2 + len(others), squeeze=False)
    ax_loss, *ax_others, ax_grad = axes[0]
    curve = [point for r in rows for point in r.get("train_curve", [])]
    if curve:
        ax_loss.plot([s for s, _ in curve], [v for _, v in curve], linewidth=0.8, alpha=0.7, color="tab:blue",
                     label="train_loss (per step)")
    ax_loss.plot(steps, [r["train_loss"] for r in rows], marker=".", linestyle="" if curve else "-", color="tab:blue",
                 label="train_loss (since the previous validation)")
    if "val_loss" in rows[-1]:
        ax_loss.plot(steps, [r.get("val_loss") for r in rows], marker=".", label="val_loss")
    ax_loss.set(title="loss", xlabel="step")
    for ax, name in zip(ax_others, others):
        ax.plot(steps, [r.get(name) for r in rows], marker=".", color="tab:green", label=name)
        ax.set(title=name, xlabel="step")
    ax_grad.plot(steps, [r["grad_norm"] for r in rows], label="mean pre-clip norm")
    ax_grad.plot(steps, [r["grad_norm_max"] for r in rows], label="max pre-clip norm", alpha=0.6)
    ax_grad.set(title="gradient norm and learning rate", xlabel="step", ylabel="gradient norm", yscale="log")
    ax_lr = ax_grad.twinx()
    ax_lr.plot(steps, [r["lr"] for r in rows], color="tab:gray", linestyle="--", label="lr (right axis)")
    ax_lr.set_ylabel("learning rate")
    if best_step is not None:
        for ax in (ax_loss, *ax_others, ax_grad):
            ax.axvline(best_step, color="tab:red", linestyle=":", label="best")
    for ax in (ax_loss, *ax_others):
        ax.legend()
    handles, labels = ax_grad.get_legend_handles_labels()
    lr_handles, lr_labels = ax_lr.get_legend_handles_labels()
    ax_grad.legend(handles + lr_handles, labels + lr_labels, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig

