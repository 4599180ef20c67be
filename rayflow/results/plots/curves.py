"""The trials' curves over time: Tune's learning curves, and RLlib's episode returns.

learning_curves draws every trial's metric against the scheduler's time attribute, with what the
scheduler did to them (trials stopped early, ASHA's rungs) and the best trial; returns draws an
RLlib run's episode return against env steps, one line per trial (its lr), with the stop goal.
Each says in its title when the run was interrupted or had trials error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rayflow.results.plots.canvas import Drawn, new_figure, run_state, title
from rayflow.results.plots.style import (
    LEGEND_MAX,
    best_trial,
    dodges,
    final_values,
    legend_label,
    styles,
    unfinished,
)
from rayflow.results.records import Trial, lookup, series

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D


def asha_rungs(grace_period: int, reduction_factor: int, max_t: int) -> list[int]:
    """The epochs where ASHA compares trials: grace_period * reduction_factor**k up to max_t."""
    rungs, t = [], int(grace_period)
    while 0 < t <= max_t and reduction_factor > 1:
        rungs.append(t)
        t *= int(reduction_factor)
    return rungs


def learning_curves(
    trials: list[Trial],
    metric: str,
    mode: str,
    max_t: int | None,
    rungs: list[int],
    x: str = "epoch",
    scheduler: str | None = "ASHA",
) -> Drawn:
    """Every trial's `metric` against `x` (the scheduler's time attribute), each in its own colour
    and marker: trials the scheduler stopped early dashed and marked with an x where they
    stopped, the best trial drawn wide and pale underneath (trials over it stay visible), ASHA's
    rungs as vertical lines; a run that was interrupted or had trials error says so in the title."""
    figure, (ax,) = new_figure()
    best = best_trial(final_values(trials, metric, x), mode)
    style = styles(trials)
    # no limit set: the furthest any trial got is one (rayflow.workloads.tune_summary.summarize)
    limit = max_t or max((p[0] for t in trials for p in series(t.rows, x, metric)), default=0)
    lines = stopped = 0
    drawn: dict[str, int] = {}  # trial id -> points drawn
    handles: list[Line2D] = []
    offsets = dodges({t.trial_id: series(t.rows, x, metric) for t in trials})
    for trial in trials:
        points = series(trial.rows, x, metric)
        if not points:
            continue
        lines += 1
        drawn[trial.trial_id] = len(points)
        # ended short of the rest: stopped
        early = bool(scheduler and limit and trial.done and points[-1][0] < limit)
        stopped += early
        shifted = [(px + offsets.get(trial.trial_id, 0.0), py) for px, py in points]
        handles.append(_curve(ax, trial, shifted, style[trial.trial_id], best, early))
    _draw_rungs(ax, rungs)
    state = run_state(trials)
    how = _schedule(scheduler, max_t, x)
    text = title(figure, ax, f"{metric} of every trial ({lines}; {how})", [state])
    _curve_axes(ax, x, metric, max_t)
    ax.legend(handles=_curve_legend(handles, scheduler, best, rungs), fontsize=8, loc="best")
    return figure, {
        "lines": lines,
        "stopped_early": stopped,
        "best": best,
        "rungs": rungs,
        "metric": metric,
        "points": drawn,
        "x": x,
        "title": text,
        "state": state,
        "dodged": sorted(offsets),
        "colors": {t: list(v) for t, v in style.items() if t in drawn},
    }


def _curve(
    ax: Axes,
    trial: Trial,
    points: list[tuple[float, float]],
    style: tuple[str, str],
    best: str | None,
    early: bool,
) -> Line2D:
    """One trial's learning curve on `ax`; returns its legend entry."""
    from matplotlib.lines import Line2D

    xs, ys = zip(*points, strict=True)
    color, marker = style
    dash: Literal["--", "-"] = "--" if early else "-"
    if trial.trial_id == best:  # a wide pale band under the best trial's own line
        ax.plot(xs, ys, color="tab:red", linewidth=7, alpha=0.3, solid_capstyle="round", zorder=1)
    # unfinished (interrupted, errored): hollow markers
    face = "none" if unfinished(trial) else color
    ax.plot(
        xs,
        ys,
        color=color,
        linestyle=dash,
        marker=marker,
        markersize=5,
        linewidth=1.5,
        alpha=0.85,
        zorder=2,
        markerfacecolor=face,
    )
    if early:
        ax.plot(xs[-1:], ys[-1:], color=color, marker="x", markersize=9, zorder=3)
    label = legend_label(trial, best, early)
    return Line2D(
        [], [], color=color, linestyle=dash, marker=marker, markerfacecolor=face, label=label
    )


def _draw_rungs(ax: Axes, rungs: list[int]) -> None:
    for k, rung in enumerate(rungs):
        ax.axvline(rung, color="tab:green", linestyle=":", linewidth=1)
        ax.annotate(
            f"rung {k}",
            (rung, 1),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="tab:green",
            ha="left",
            va="top",
            xytext=(2, -2),
            textcoords="offset points",
        )


def _schedule(scheduler: str | None, max_t: int | None, x: str) -> str:
    """What decided how long the trials ran, for the learning curves' title."""
    if scheduler:
        return f"{scheduler}, max_t={max_t}"
    return f"{x} up to {max_t}" if max_t else "no scheduler"


def _curve_axes(ax: Axes, x: str, metric: str, max_t: int | None) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set(xlabel=x, ylabel=metric)
    if max_t:
        ax.set_xlim(0.8, max(max_t, 1) + 0.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _curve_legend(
    handles: list[Line2D], scheduler: str | None, best: str | None, rungs: list[int]
) -> list[Line2D]:
    """The learning curves' legend: each trial (or, too many to name, the kinds of line only), the
    best trial's band, ASHA's rungs."""
    from matplotlib.lines import Line2D

    if len(handles) > LEGEND_MAX:  # too many to name: the kinds of line only
        handles = [Line2D([], [], color="tab:blue", label="trial (one colour each)")]
        if scheduler:
            stopped = f"stopped early by {scheduler}"
            handles.append(
                Line2D([], [], color="tab:gray", linestyle="--", marker="x", label=stopped)
            )
    handles.append(Line2D([], [], color="tab:red", linewidth=7, alpha=0.3, label=f"best: {best}"))
    if rungs:
        handles.append(Line2D([], [], color="tab:green", linestyle=":", label="ASHA rung"))
    return handles


# as in rayflow.workloads.rllib_results
RETURN, STEPS = "env_runners/episode_return_mean", "num_env_steps_sampled_lifetime"


def returns(trials: list[Trial], goal: float | None, algorithm: str = "PPO") -> Drawn:
    """RLlib: episode return against env steps, one line per trial (its lr) in its own colour and
    marker, the stop goal dashed; an interrupted or errored run says so in the title."""
    figure, (ax,) = new_figure()
    style = styles(trials)
    lrs, points = [], []
    for trial in sorted(trials, key=lambda t: (lookup(t.params, "lr") or 0, t.trial_id)):
        curve = series(trial.rows, STEPS, RETURN)
        if not curve:
            continue
        lr = lookup(trial.params, "lr")
        color, marker = style[trial.trial_id]
        ax.plot(
            *zip(*curve, strict=True),
            color=color,
            marker=marker,
            markersize=4,
            alpha=0.85,
            label=f"lr={lr:g}" if isinstance(lr, (int, float)) else trial.trial_id,
        )
        lrs.append(lr)
        points.append(len(curve))
    if goal is not None:
        ax.axhline(
            goal, color="tab:red", linestyle="--", linewidth=1, label=f"stop: return {goal:g}"
        )
    state = run_state(trials)
    text = title(figure, ax, f"{algorithm}: episode return per trial", [state])
    ax.set(xlabel="env steps sampled", ylabel="episode_return_mean")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing drawn (no episode ended): no legend
        ax.legend(fontsize=8)
    return figure, {
        "lines": len(lrs),
        "lrs": lrs,
        "points": points,
        "goal": goal,
        "title": text,
        "state": state,
    }
