"""The run's summary: best checkpoint and why, stability, the first failure pattern."""
from __future__ import annotations

from baton.workers.tracking.curves import plot_curves
from baton.workers.tracking.report import Provenance, build_report


def _rows(train, val, acc=None, grad=None, grad_max=None, nonfinite=None):
    n = len(train)
    return [{"epoch": i, "step": 10 * (i + 1), "train_loss": train[i], "val_loss": val[i],
             "val_accuracy": (acc or [0.5] * n)[i], "lr": 0.01, "grad_norm": (grad or [1.0] * n)[i],
             "grad_norm_max": (grad_max or [2.0] * n)[i], "nonfinite_steps": (nonfinite or [0] * n)[i],
             "ckpt_count": 1, "ckpt_skipped": 0, "ckpt_stall_s": 0.01, "ckpt_write_s": 0.1} for i in range(n)]


def _best(rows, metric="val_loss", mode="min"):
    values = [r[metric] for r in rows]
    i = values.index(min(values) if mode == "min" else max(values))
    return {"metric": metric, "mode": mode, "value": values[i], "step": rows[i]["step"], "epoch": i}


def test_a_healthy_run_is_stable_with_no_pattern():
    rows = _rows([1.0, 0.6, 0.4, 0.3], [1.1, 0.7, 0.5, 0.4])
    report = build_report("j", {"name": "n"}, rows, _best(rows), Provenance(1))
    assert report["stability"]["stable"] and report["first_failure_pattern"] is None
    assert report["best"]["epoch"] == 3 and "best and last differ" not in report["best"]["why"]


def test_overfitting_is_named_and_best_differs_from_last():
    rows = _rows([1.0, 0.6, 0.4, 0.3, 0.2], [1.0, 0.7, 0.8, 0.9, 1.0])
    report = build_report("j", {"name": "n"}, rows, _best(rows), Provenance(1))
    assert report["stability"]["overfitting_from_epoch"] == 2
    assert report["first_failure_pattern"].startswith("overfitting from epoch 2")
    assert report["best"]["epoch"] == 1 and "best and last differ" in report["best"]["why"]


def test_nonfinite_steps_and_spikes_make_a_run_unstable_and_the_first_one_is_named_first():
    rows = _rows([1.0, 0.8, 0.7, 0.6], [1.0, 0.8, 0.7, 0.6],
                 grad=[1.0, 1.0, 1.0, 1.0], grad_max=[2.0, 50.0, 2.0, 2.0], nonfinite=[0, 0, 3, 3])
    report = build_report("j", {"name": "n"}, rows, _best(rows), Provenance(1))
    assert not report["stability"]["stable"]
    assert report["stability"]["nonfinite_steps"] == 3
    assert [s["epoch"] for s in report["stability"]["grad_norm_spikes"]] == [1]
    assert report["first_failure_pattern"].startswith("gradient-norm spike in epoch 1")
    assert any(p.startswith("non-finite training loss") for p in report["failure_patterns"])


def test_a_converging_run_is_not_called_spiky():
    # norms shrink as a run converges: early large norms are not spikes
    rows = _rows([1.0, 0.5, 0.2, 0.1], [1.0, 0.5, 0.3, 0.2], grad=[4.0, 1.0, 0.3, 0.1], grad_max=[12.0, 3.0, 1.2, 0.5])
    assert build_report("j", {"name": "n"}, rows, _best(rows), Provenance(1))["stability"]["grad_norm_spikes"] == []


def test_no_finite_monitored_value_means_no_best():
    rows = _rows([1.0, 0.9], [float("nan"), float("nan")])
    best = {"metric": "val_loss", "mode": "min", "value": None, "step": None, "epoch": None}
    report = build_report("j", {"name": "n"}, rows, best, Provenance(1))
    assert report["best"]["checkpoint"] is None and report["best"]["why"].startswith("none")


def test_curves_are_a_png():
    rows = _rows([1.0, 0.6], [1.1, 0.7])
    assert plot_curves(rows, 1, "t")[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_curves(rows, None, "t")[:4] == b"\x89PNG"


def test_each_validation_metric_has_its_own_axis_and_the_learning_rate_is_in_a_legend():
    """A perplexity of 6-10 and an accuracy of 0.4 on one axis flattened the accuracy into a line."""
    from baton.workers.tracking.curves import figure

    rows = _rows([1.0, 0.6], [1.1, 0.7])
    for row, (perplexity, accuracy) in zip(rows, [(10.0, 0.35), (6.0, 0.42)]):
        row.update(val_perplexity=perplexity, val_accuracy=accuracy)
    fig = figure(rows, 1, "t")
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert sorted(titled) == sorted(["loss", "val_perplexity", "val_accuracy", "gradient norm and learning rate"])
    low, high = titled["val_accuracy"].get_ylim()
    assert 0.3 < low and high < 0.5  # its own scale
    legend = [text.get_text() for text in titled["gradient norm and learning rate"].get_legend().get_texts()]
    assert "lr (right axis)" in legend and "mean pre-clip norm" in legend


def test_the_loss_panel_draws_the_training_loss_step_by_step():
    """Six validations of a 600-step run drew six points: the rows' per-step curve is drawn whole."""
    from baton.workers.tracking.curves import figure

    rows = _rows([1.0, 0.6], [1.1, 0.7])
    rows[0]["train_curve"] = [[step, 1.0 / step] for step in range(1, 11)]
    rows[1]["train_curve"] = [[step, 1.0 / step] for step in range(11, 21)]
    loss = next(ax for ax in figure(rows, 1, "t").axes if ax.get_title() == "loss")
    lines = {line.get_label(): line for line in loss.get_lines()}
    assert list(lines["train_loss (per step)"].get_xdata()) == list(range(1, 21))
    assert "train_loss (since the previous validation)" in lines and "val_loss" in lines
