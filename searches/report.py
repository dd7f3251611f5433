"""A search's report (``baton sweep-status ID --report DIR``, ``JobClient.search_report``): ``report.md``, the
table of its trials (parameters, standing, metric at each rung, best value) and its best trial, and
``rungs.png``, each trial's metric across the rungs, the stopped ones ending where they stopped and the
best trial drawn bold. Written from what ``search_results`` reads; the search is not changed."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from baton.searches.results import SearchResults


def write_report(results: SearchResults, dest: "str | Path") -> list[Path]:
    """The report's files, written into ``dest`` (made if missing)."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    plot = out / "rungs.png"
    _plot(results, plot)
    page = out / "report.md"
    page.write_text(markdown(results, plot.name))
    return [page, plot]


def markdown(results: SearchResults, plot: str) -> str:
    r, unit = results, results.unit[:-1]
    axes = list(r.trials[0].params) if r.trials else []
    rungs = r.rungs[:-1]
    head = ["trial", "job", "standing", *axes, *(f"{r.monitor} @{unit} {at}" for at in rungs), f"best {r.monitor}"]
    rows = [[str(t.number), t.status.id, t.standing, *(_cell(t.params.get(p)) for p in axes),
             *(_number(t.rung_values.get(at)) for at in rungs), _number(t.status.best_value)] for t in r.trials]
    best = next((t for t in r.trials if t.status.id == r.best), None)
    lines = [f"# Search {r.search_id}", "",
             f"{r.state}; {len(r.trials)} trials, {r.search_steps} steps trained; {r.monitor} ({r.mode}) compared at "
             f"{unit}s {', '.join(map(str, r.rungs[:-1])) or '(none)'}; the run ends at {unit} {r.rungs[-1]}.", ""]
    if best is not None:
        lines += [f"**Best trial: {best.status.id}** ({r.monitor} {_number(best.status.best_value)}), "
                  f"{', '.join(f'{k} = {_cell(v)}' for k, v in best.params.items())}.", ""]
    if r.error:
        lines += [f"Failed: {r.error}", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines + ["", f"![{r.monitor} at each rung]({plot})", ""])


def _plot(results: SearchResults, path: Path) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure  # not pyplot: a report made in a notebook leaves its backend alone

    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    colours = colormaps["tab20"]
    for i, t in enumerate(results.trials):
        points = sorted((at, v) for at, v in t.rung_values.items() if v is not None and math.isfinite(v))
        if t.status.best_value is not None and math.isfinite(t.status.best_value) and t.standing == "finished":
            points.append((results.rungs[-1], t.status.best_value))
        if not points:
            continue
        best = t.status.id == results.best
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", linewidth=2.5 if best else 1,
                color=colours(i % 20), alpha=1.0 if best else 0.55, label=f"{t.status.id} (best)" if best else None)
        ax.annotate(str(t.number), points[-1], textcoords="offset points", xytext=(5, 0), fontsize=7,
                    va="center", color=colours(i % 20))  # (which trial each line is: its number)
    ax.set_xscale("log")
    ax.set_xticks(results.rungs, [str(at) for at in results.rungs])
    ax.minorticks_off()
    ax.set_xlabel(f"{results.unit[:-1]} (the last: each finished trial's best {results.monitor})")
    ax.set_ylabel(results.monitor)
    ax.set_title(f"search {results.search_id}: {results.monitor} at each rung")
    if results.best:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _cell(value: Any) -> str:
    """A parameter as a table cell (a choice may be any YAML value: its pipes would split the row)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "\\|")
