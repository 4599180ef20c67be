"""Plots of a finished (or interrupted) run, drawn on the driver after it, into
`<experiment>/plots/`.

Pure functions turn what rayflow.results.records reads from the experiment folder into matplotlib
Figures; make_plots picks the figures by what the workload ran and writes them as PNGs. Only
matplotlib's object API with the Agg canvas is used, never pyplot and its global state. Each PNG
carries a summary of what it draws (lines, trials stopped early, the best trial, ASHA's rungs) as
JSON in its "rayflow" text chunk: `PIL.Image.open(png).text["rayflow"]`.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rayflow.results.records import (
    FINISHED,
    Trial,
    lookup,
    series,
    trial_statuses,
    tune_trials,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

FOLDER = "plots"  # in the experiment folder, and the parent MLflow run's artifact path
META_KEY = "rayflow"

# A plot: its figure, and the summary of what it draws that its PNG carries
Drawn = tuple["Figure", dict[str, Any]]
# (file name, a function drawing the plot): what a workload's `figures` returns
Figures = list[tuple[str, Callable[[], Drawn]]]


def _figure(
    rows: int = 1, cols: int = 1, width: float = 7.0, height: float = 4.5
) -> tuple[Figure, list[Axes]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, list(figure.subplots(rows, cols, squeeze=False).ravel())


def save(figure: Figure, path: Path, meta: dict[str, Any]) -> Path:
    figure.savefig(path, format="png", dpi=100, metadata={META_KEY: json.dumps(meta)})
    return path


# Each trial keeps one colour and one marker in every plot, so overlapping trials stay apart and a
# trial is found again from one plot to the next. Red is the best trial's mark, left out here.
COLORS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
    "navy",
    "darkgoldenrod",
    "teal",
)
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")
LEGEND_MAX = 8  # trials named one by one in a legend; more get a legend of kinds only


def styles(trials: list[Trial]) -> dict[str, tuple[str, str]]:
    """trial id -> (colour, marker), by the trials' order (their ids): no two alike for up to 60
    trials (12 colours and 10 markers cycle apart)."""
    ordered = sorted(trials, key=lambda t: t.trial_id)
    return {
        t.trial_id: (COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)])
        for i, t in enumerate(ordered)
    }


def dodges(curves: dict[str, list[tuple[float, float]]], width: float = 0.24) -> dict[str, float]:
    """trial id -> an x offset: trials whose curves come near another's (a point at the same x,
    within 2% of the plot's height) are set side by side across `width` (of an x unit), so one
    does not hide the other; the rest stay put."""
    ys = [y for points in curves.values() for _, y in points]
    near = (max(ys) - min(ys)) / 50 if ys else 0.0
    at: dict[float, list[tuple[float, str]]] = {}
    for trial_id, points in curves.items():
        for x, y in points:
            at.setdefault(x, []).append((y, trial_id))
    shared = set()
    for column in at.values():
        column.sort()
        for (y0, a), (y1, b) in pairwise(column):
            if a != b and y1 - y0 <= near:
                shared |= {a, b}
    if len(shared) < 2:
        return {}
    ordered = sorted(shared)
    return {t: width * (k / (len(ordered) - 1) - 0.5) for k, t in enumerate(ordered)}


def run_state(trials: list[Trial]) -> str:
    """How the run ended, for a title: "" when every trial finished (or Tune left no state), else
    what was left: trials an interrupt left unfinished, trials that errored."""
    known = [t for t in trials if t.status is not None]
    unfinished = sum(1 for t in known if t.status != FINISHED and not t.errored)
    errored = sum(1 for t in known if t.errored)
    parts = []
    if unfinished:
        parts.append(f"INTERRUPTED: {unfinished} of {len(trials)} trials unfinished")
    if errored:
        parts.append(f"{errored} of {len(trials)} trials ERRORED")
    return "; ".join(parts)


def fit_title(figure: Figure, text: str, fontsize: float = 12) -> str:
    """`text` wrapped to the figure's width (a suptitle is never clipped at its edges)."""
    # an average glyph: ~0.62 em
    chars = max(20, int(figure.get_figwidth() * 72 / (fontsize * 0.62)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False))


def title(figure: Figure, ax: Axes | None, head: str, notes: list[str]) -> str:
    """The plot's title: `head`, then its notes (the fixed keys, how the run ended), each wrapped to
    fit; on the figure when it has several panels, else on the axes."""
    text = "\n".join(
        fit_title(figure, line, 12 if i == 0 else 10)
        for i, line in enumerate([head, *filter(None, notes)])
    )
    if ax is None:
        figure.suptitle(text, fontsize=12)
    else:
        ax.set_title(text, fontsize=11)
    return text


def asha_rungs(grace_period: int, reduction_factor: int, max_t: int) -> list[int]:
    """The epochs where ASHA compares trials: grace_period * reduction_factor**k up to max_t."""
    rungs, t = [], int(grace_period)
    while 0 < t <= max_t and reduction_factor > 1:
        rungs.append(t)
        t *= int(reduction_factor)
    return rungs


def final_values(
    trials: list[Trial], metric: str, x: str = "training_iteration"
) -> dict[str, float]:
    """Each trial's last reported value of `metric` (Tune's best trial compares these,
    scope="last")."""
    finals = {}
    for trial in trials:
        points = series(trial.rows, x, metric)
        if points:
            finals[trial.trial_id] = points[-1][1]
    return finals


def best_trial(finals: dict[str, float], mode: str) -> str | None:
    if not finals:
        return None
    pick = min if mode == "min" else max
    return pick(finals, key=finals.__getitem__)


def _open(trial: Trial) -> bool:
    """An unfinished trial (interrupted, errored): its last value is not a final one; drawn
    hollow."""
    return trial.status is not None and trial.status != FINISHED


def _label(trial: Trial, best: str | None, early: bool = False) -> str:
    """A trial's name in a legend, with what sets it apart: best, stopped early, unfinished."""
    label = (
        trial.trial_id
        + (" (best)" if trial.trial_id == best else "")
        + (" (stopped)" if early else "")
    )
    return label + ((" (errored)" if trial.errored else " (unfinished)") if _open(trial) else "")


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
    figure, (ax,) = _figure()
    best = best_trial(final_values(trials, metric, x), mode)
    style = styles(trials)
    # no limit set: the furthest any trial got is one (rayflow.workloads.tune_runner.summarize)
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
    face = "none" if _open(trial) else color  # unfinished (interrupted, errored): hollow markers
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
    label = _label(trial, best, early)
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


def tune_figures(
    experiment_dir: Path,
    metric: str,
    mode: str,
    x: str,
    max_t: int | None,
    rungs: list[int],
    scheduler: str | None,
    keys: tuple[str, ...] | None = None,
) -> Figures:
    """The plots of any Tune experiment: learning curves of `metric` over `x`, and the search
    view (of the config's `keys` where given, else of every key that varies)."""
    trials = tune_trials(experiment_dir)
    if keys is not None:  # what else a trial's config carries is not a hyperparameter
        trials = [
            replace(t, params={k: v for k, v in t.params.items() if k in keys}) for t in trials
        ]
    # A trial that errored before it wrote its folder (an actor Tune failed to reuse) is only in
    # Tune's state: kept, without reports, so the title still counts it.
    seen = {t.trial_id for t in trials}
    trials += [
        Trial(trial_id, {}, [], status)
        for trial_id, status in sorted(trial_statuses(experiment_dir).items())
        if trial_id not in seen
    ]
    return [
        (
            "learning_curves.png",
            lambda: learning_curves(trials, metric, mode, max_t, rungs, x, scheduler),
        ),
        ("search.png", lambda: search_view(trials, metric, mode, x)),
    ]


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
    figure, axes = _figure(rows, cols, width=max(3.2 * cols, 6.4), height=3.2 * rows + 1.4)
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
        linewidths=0.8 if _open(trial) else 0.4,
        facecolors="none" if _open(trial) else color,
        edgecolors=color if _open(trial) else "black",
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
            markerfacecolor="none" if _open(t) else style[t.trial_id][0],
            label=_label(t, best),
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


def training(rows: list[dict[str, Any]]) -> Drawn:
    """A Ray Train run per epoch: train and val loss, val accuracy, samples/s."""
    figure, (loss, accuracy, speed) = _figure(1, 3, width=13, height=4)
    lines = {"loss": 0, "accuracy": 0, "throughput": 0}
    for ax, panel, keys in (
        (loss, "loss", ("train_loss", "val_loss")),
        (accuracy, "accuracy", ("val_accuracy",)),
        (speed, "throughput", ("samples_per_s",)),
    ):
        for key in keys:
            points = series(rows, "epoch", key)
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
                lines[panel] += 1
        ax.set(
            xlabel="epoch",
            ylabel=panel if panel != "throughput" else "samples/s",
            title=", ".join(keys),
        )
        _whole_ticks(ax)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    epochs = [int(x) for x, _ in series(rows, "epoch", "epoch")]
    ticks = sorted({float(t) for ax in (loss, accuracy, speed) for t in ax.get_xticks()})
    return figure, {"lines": sum(lines.values()), "panels": lines, "epochs": epochs, "ticks": ticks}


def _whole_ticks(ax: Axes) -> None:
    """Epochs and reports are counted: no tick between two (a 2-epoch run had 1.25, 1.5, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def reports(rows: list[dict[str, Any]], panels: int = 6) -> Drawn:
    """A Ray Train run's reports: each number it reports (up to `panels`) against the epoch, or
    the report's index where it reports none."""
    x = "epoch" if rows and all("epoch" in r for r in rows) else "report"
    rows = [r if x == "epoch" else {**r, "report": i} for i, r in enumerate(rows, 1)]
    keys = sorted(
        {
            k
            for r in rows
            for k, v in r.items()
            if k not in ("epoch", "report") and series([r], x, k)
        }
    )[:panels]
    cols = min(max(len(keys), 1), 3)
    figure, axes = _figure(
        math.ceil(max(len(keys), 1) / cols),
        cols,
        width=4.3 * cols,
        height=3.6 * math.ceil(max(len(keys), 1) / cols),
    )
    # fewer keys than the grid has panels: the rest are hidden
    for ax, key in zip(axes, keys, strict=False):
        ax.plot(*zip(*series(rows, x, key), strict=True), marker="o", markersize=3)
        ax.set(xlabel=x, ylabel=key, title=key)
        _whole_ticks(ax)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    return figure, {"panels": keys, "x": x, "points": len(rows)}


# as in rayflow.workloads.rllib_results
RETURN, STEPS = "env_runners/episode_return_mean", "num_env_steps_sampled_lifetime"


def returns(trials: list[Trial], goal: float | None, algorithm: str = "PPO") -> Drawn:
    """RLlib: episode return against env steps, one line per trial (its lr) in its own colour and
    marker, the stop goal dashed; an interrupted or errored run says so in the title."""
    figure, (ax,) = _figure()
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


def make_plots(figures: Figures, experiment_dir: Path) -> list[Path]:
    """Draw `figures` ((file name, a function returning (Figure, summary)) pairs: the workload's,
    rayflow.workloads.Workload.figures) into `<experiment_dir>/plots/`; returns the PNGs written.
    A figure with nothing on it (no trial reported) is not written. A plot that fails is left out
    with one warning line; it never fails the run."""
    folder = Path(experiment_dir) / FOLDER
    written = []
    for name, draw in figures:
        # never leave an earlier run's picture as this one's
        (folder / name).unlink(missing_ok=True)
        try:
            figure, meta = draw()
            # a run with no result to draw (every trial errored): no blank picture
            if drew_nothing(meta):
                continue
            folder.mkdir(parents=True, exist_ok=True)
            written.append(save(figure, folder / name, meta))
        # Broad on purpose: a plot is a by-product of a run that has already finished; whatever
        # goes wrong drawing it (odd results, a matplotlib quirk) must not turn it into a failure.
        except Exception as err:  # noqa: BLE001
            warn(f"{name}: {type(err).__name__}: {err}")
    return written


def drew_nothing(meta: dict[str, Any]) -> bool:
    """A figure's summary says it holds no data: no line (curves, returns), no point (search,
    reports)."""
    return not meta.get("lines", meta.get("points"))


def warn(message: str) -> None:
    print(f"rayflow: warning: plots: {message}", file=sys.stderr, flush=True)


def read_meta(png: Path) -> dict[str, Any]:
    """The summary a plot stored in its PNG (see save)."""
    from PIL import Image

    with Image.open(png) as image:
        meta: dict[str, Any] = json.loads(image.text[META_KEY])
        return meta
