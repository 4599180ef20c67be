"""The search view: each trial's final value against each of its hyperparameters.

One panel per searched key (scalar, and not one fixed value across the trials): floats on a log
axis, the rest as categories spread apart where trials share one; the keys every trial had fixed
are named in the title rather than drawn. Kept apart from the curves: it reads the trials' configs
(which keys were searched), where the curves read only their reports.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from rayflow.results.plots.canvas import Drawn, new_figure, run_state, title
from rayflow.results.plots.style import (
    LEGEND_MAX,
    best_trial,
    final_values,
    legend_label,
    styles,
    unfinished,
)
from rayflow.results.records import Trial

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _floats(values: list[Any]) -> list[float] | None:
    """The values where every one is a float (drawn on a number axis), else None (categories)."""
    floats = [v for v in values if isinstance(v, float)]
    return floats if len(floats) == len(values) else None


def _scalar(value: object) -> bool:
    return isinstance(value, (int, float, str, bool))


def hyperparameters(trials: list[Trial]) -> list[str]:
    """The searched keys of the trials' configs: scalar, and not one fixed value across trials."""
    keys = sorted({k for t in trials for k, v in t.params.items() if _scalar(v)})
    if len(trials) > 1:
        keys = [k for k in keys if len({json.dumps(t.params.get(k)) for t in trials}) > 1]
    return keys


def fixed_keys(trials: list[Trial]) -> dict[str, Any]:
    """The scalar keys every trial ran with one same value (a constant of the config, or a search
    space key with one value): not a panel, but named on the plot. None for a single trial."""
    if len(trials) < 2:
        return {}
    keys = sorted({k for t in trials for k, v in t.params.items() if _scalar(v)})
    return {
        k: trials[0].params.get(k)
        for k in keys
        if len({json.dumps(t.params.get(k)) for t in trials}) == 1
    }


def _spread(xs: list[float], width: float = 0.3) -> list[float]:
    """Category positions moved apart where several trials share one, across `width` around it,
    so no point hides another."""
    seen: dict[float, int] = {}
    counts = {x: xs.count(x) for x in xs}
    out = []
    for x in xs:
        k, n = seen.get(x, 0), counts[x]
        seen[x] = k + 1
        out.append(x + (width * (k / (n - 1) - 0.5) if n > 1 else 0.0))
    return out


def _log_axis(ax: Axes) -> None:
    """A log x axis with its labels slanted: a span of less than a decade is labelled at its minor
    ticks (2x10^-2, 3x10^-2, ...), which run together when level."""
    ax.set_xscale("log")
    ax.tick_params(axis="x", which="both", labelrotation=35, labelsize=8)


def search_view(
    trials: list[Trial], metric: str, mode: str, x: str = "training_iteration"
) -> Drawn:
    """Each trial's final `metric` against each hyperparameter: floats on a log axis (lr, from a
    log-uniform), the rest (tune.choice) as categories, spread apart where they share one; each
    trial in its own colour and marker (as in the learning curves), the best ringed by a red
    star. The title names the keys every trial had fixed, and an interrupted or errored run."""
    finals = final_values(trials, metric, x)
    best = best_trial(finals, mode)
    done = [t for t in trials if t.trial_id in finals]
    keys = hyperparameters(done) or ["(none)"]
    fixed = fixed_keys(done)
    style = styles(trials)
    cols = min(len(keys), 4)
    rows = math.ceil(len(keys) / cols)
    figure, axes = new_figure(rows, cols, width=max(3.2 * cols, 6.4), height=3.2 * rows + 1.4)
    # fewer keys than the grid has panels: the rest are hidden
    for ax, key in zip(axes, keys, strict=False):
        xs = _positions(ax, [t.params.get(key) for t in done])
        for px, py, t in zip(xs, [finals[t.trial_id] for t in done], done, strict=True):
            _point(ax, px, py, t, style[t.trial_id], best)
        ax.set(xlabel=key, ylabel=f"final {metric}")
        ax.grid(alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    _search_legend(figure, done, style, best)
    notes = [
        "fixed: " + ", ".join(f"{k}={v}" for k, v in fixed.items()) if fixed else "",
        run_state(trials),
    ]
    text = title(figure, None, f"final {metric} of each trial against its hyperparameters", notes)
    return figure, {
        "panels": keys,
        "points": len(done),
        "best": best,
        "metric": metric,
        "fixed": fixed,
        "title": text,
        "state": run_state(trials),
        "colors": {t.trial_id: list(style[t.trial_id]) for t in done},
    }


def _positions(ax: Axes, values: list[Any]) -> list[float]:
    """Where each trial's value of one hyperparameter goes on the x axis of its panel (set up to
    suit): a float where all are floats (on a log axis when all are positive), else the index of
    its category, spread apart from the others there."""
    floats = _floats(values)
    if floats is not None:
        if all(v > 0 for v in floats):
            _log_axis(ax)
        return floats
    labels = sorted({json.dumps(v) for v in values}, key=lambda s: (len(s), s))
    ax.set_xticks(range(len(labels)), [json.loads(s) if s.startswith('"') else s for s in labels])
    ax.set_xlim(-0.5, len(labels) - 0.5)
    return _spread([labels.index(json.dumps(v)) for v in values])


def _point(
    ax: Axes, px: float, py: float, trial: Trial, style: tuple[str, str], best: str | None
) -> None:
    """One trial's final value in a search panel: the best one over a red star, an unfinished one
    hollow."""
    color, marker = style
    if trial.trial_id == best:
        ax.scatter([px], [py], color="tab:red", marker="*", s=380, alpha=0.45, zorder=1)
    ax.scatter(
        [px],
        [py],
        marker=marker,
        s=40,
        alpha=0.85,
        zorder=2,
        linewidths=0.8 if unfinished(trial) else 0.4,
        facecolors="none" if unfinished(trial) else color,
        edgecolors=color if unfinished(trial) else "black",
    )


def _search_legend(
    figure: Figure, done: list[Trial], style: dict[str, tuple[str, str]], best: str | None
) -> None:
    """Each trial by name (none where there are too many to name), and the best trial's star."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            color=style[t.trial_id][0],
            marker=style[t.trial_id][1],
            linestyle="",
            markerfacecolor="none" if unfinished(t) else style[t.trial_id][0],
            label=legend_label(t, best),
        )
        for t in done
    ]
    if len(handles) > LEGEND_MAX:
        handles = []
    if best is not None:
        handles.append(
            Line2D(
                [],
                [],
                color="tab:red",
                marker="*",
                markersize=14,
                alpha=0.45,
                linestyle="",
                label=f"best: {best}",
            )
        )
    if handles:
        figure.legend(
            handles=handles, fontsize=7, loc="outside lower center", ncols=min(len(handles), 4)
        )
