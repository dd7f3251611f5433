"""curves.png: training and validation loss, the task's other metrics, gradient norm and lr, by step."""
from __future__ import annotations

import io
from typing import Optional

import matplotlib

matplotlib.use("Agg")  # headless: workers have no display
import matplotlib.pyplot as plt  # noqa: E402

from baton.schemas.metrics import val_metrics  # noqa: E402


def plot_curves(rows: list[dict], best_step: Optional[int], title: str) -> bytes:
    steps = [r["step"] for r in rows]
    others = [name for name in val_metrics(rows[-1]) if name != "val_loss"]
    fig, (ax_loss, ax_val, ax_grad) = plt.subplots(1, 3, figsize=(14, 4))
    ax_loss.plot(steps, [r["train_loss"] for r in rows], label="train_loss")
    if "val_loss" in rows[-1]:
        ax_loss.plot(steps, [r.get("val_loss") for r in rows], label="val_loss")
    ax_loss.set(title="loss", xlabel="step")
    for name in others:
        ax_val.plot(steps, [r.get(name) for r in rows], label=name)
    ax_val.set(title="validation metrics", xlabel="step")
    ax_grad.plot(steps, [r["grad_norm"] for r in rows], label="mean pre-clip norm")
    ax_grad.plot(steps, [r["grad_norm_max"] for r in rows], label="max pre-clip norm", alpha=0.6)
    ax_grad.set(title="gradient norm", xlabel="step", yscale="log")
    ax_lr = ax_grad.twinx()
    ax_lr.plot(steps, [r["lr"] for r in rows], color="tab:gray", linestyle="--", label="lr")
    ax_lr.set_ylabel("learning rate")
    if best_step is not None:
        for ax in (ax_loss, ax_val, ax_grad):
            ax.axvline(best_step, color="tab:red", linestyle=":", label="best")
    ax_loss.legend()
    if others:
        ax_val.legend()
    ax_grad.legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
