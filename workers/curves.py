"""curves.png: train vs validation loss, validation accuracy, gradient norm and learning rate."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: workers have no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(rows: list[dict], best_epoch: "int | None", title: str) -> bytes:
    epochs = [r["epoch"] for r in rows]
    fig, (ax_loss, ax_acc, ax_grad) = plt.subplots(1, 3, figsize=(14, 4))
    ax_loss.plot(epochs, [r["train_loss"] for r in rows], label="train")
    ax_loss.plot(epochs, [r["val_loss"] for r in rows], label="validation")
    ax_loss.set(title="loss (per sample)", xlabel="epoch")
    ax_acc.plot(epochs, [r["val_accuracy"] for r in rows], color="tab:green")
    ax_acc.set(title="validation accuracy", xlabel="epoch")
    ax_grad.plot(epochs, [r["grad_norm"] for r in rows], label="mean pre-clip norm")
    ax_grad.plot(epochs, [r["grad_norm_max"] for r in rows], label="max pre-clip norm", alpha=0.6)
    ax_grad.set(title="gradient norm", xlabel="epoch", yscale="log")
    ax_lr = ax_grad.twinx()
    ax_lr.plot(epochs, [r["lr"] for r in rows], color="tab:gray", linestyle="--", label="lr")
    ax_lr.set_ylabel("learning rate")
    if best_epoch is not None:
        for ax in (ax_loss, ax_acc, ax_grad):
            ax.axvline(best_epoch, color="tab:red", linestyle=":", label="best")
    ax_loss.legend()
    ax_grad.legend(loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
