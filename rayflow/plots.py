"""Plots of a finished (or interrupted) run, drawn on the driver after it, into `<experiment>/plots/`.

Pure functions turn what rayflow.plots_data reads from the experiment folder into matplotlib
Figures; make_plots picks the figures by what the workload ran and writes them as PNGs. Only
matplotlib's object API with the Agg canvas is used, never pyplot and its global state. Each PNG
carries a summary of what it draws (lines, trials stopped early, the best trial, ASHA's rungs) as
JSON in its "rayflow" text chunk: `PIL.Image.open(png).text["rayflow"]`.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rayflow.plots_data import Trial, lookup, series, tune_trials

FOLDER = "plots"  # in the experiment folder, and the parent MLflow run's artifact path
META_KEY = "rayflow"


def _figure(rows: int = 1, cols: int = 1, width: float = 7.0, height: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.subplots(rows, cols, squeeze=False).ravel()


def save(figure, path: Path, meta: dict) -> Path:
    figure.savefig(path, format="png", dpi=100, metadata={META_KEY: json.dumps(meta)})
    return path


def asha_rungs(grace_period: int, reduction_factor: int, max_t: int) -> list[int]:
    """The epochs where ASHA compares trials: grace_period * reduction_factor**k up to max_t."""
    rungs, t = [], int(grace_period)
    while 0 < t <= max_t and reduction_factor > 1:
        rungs.append(t)
        t *= int(reduction_factor)
    return rungs


def final_values(trials: list[Trial], metric: str, x: str = "training_iteration") -> dict[str, float]:
    """Each trial's last reported value of `metric` (Tune's best trial compares these, scope="last")."""
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
    return pick(finals, key=finals.get)


def learning_curves(trials: list[Trial], metric: str, mode: str, max_t: int | None, rungs: list[int],
                    x: str = "epoch", scheduler: str | None = "ASHA"):
    """Every trial's `metric` against `x` (the scheduler's time attribute): trials the scheduler
    stopped early dashed, faded and marked with an x where they stopped, the best trial bold,
    ASHA's rungs as vertical lines. `scheduler`: the name of one that stops trials early, or None."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    figure, (ax,) = _figure()
    finals = final_values(trials, metric, x)
    best = best_trial(finals, mode)
    # no limit set: the furthest any trial got is one (rayflow.tuning.summarize)
    limit = max_t or max((p[0] for t in trials for p in series(t.rows, x, metric)), default=0)
    lines = stopped = 0
    drawn = {}  # trial id -> points drawn
    for trial in trials:
        points = series(trial.rows, x, metric)
        if not points:
            continue
        xs, ys = zip(*points)
        lines += 1
        drawn[trial.trial_id] = len(points)
        early = bool(scheduler and limit and trial.done and xs[-1] < limit)  # ended short of the rest: stopped
        stopped += early
        color = "tab:red" if trial.trial_id == best else "tab:gray" if early else "tab:blue"
        if trial.trial_id == best:
            ax.plot(xs, ys, color=color, linewidth=2.5, marker="o", markersize=3, zorder=3,
                    linestyle="--" if early else "-")
        elif early:
            ax.plot(xs, ys, color=color, linestyle="--", alpha=0.5, linewidth=1)
        else:
            ax.plot(xs, ys, color=color, alpha=0.7, linewidth=1.2)
        if early:
            ax.plot(xs[-1:], ys[-1:], color=color, marker="x", markersize=7, alpha=0.8)
    for k, rung in enumerate(rungs):
        ax.axvline(rung, color="tab:green", linestyle=":", linewidth=1)
        ax.annotate(f"rung {k}", (rung, 1), xycoords=("data", "axes fraction"), fontsize=7,
                    color="tab:green", ha="left", va="top", xytext=(2, -2), textcoords="offset points")
    how = f"{scheduler}, max_t={max_t}" if scheduler else f"{x} up to {max_t}" if max_t else "no scheduler"
    ax.set(xlabel=x, ylabel=metric, title=f"{metric} of every trial ({lines}; {how})")
    if max_t:
        ax.set_xlim(0.8, max(max_t, 1) + 0.2)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    handles = [Line2D([], [], color="tab:blue", label="trial")]
    if scheduler:
        handles.append(Line2D([], [], color="tab:gray", linestyle="--", marker="x", alpha=0.6, label=f"stopped early by {scheduler}"))
    handles.append(Line2D([], [], color="tab:red", linewidth=2.5, label=f"best: {best}"))
    if rungs:
        handles.append(Line2D([], [], color="tab:green", linestyle=":", label="ASHA rung"))
    ax.legend(handles=handles, fontsize=8, loc="best")
    return figure, {"lines": lines, "stopped_early": stopped, "best": best, "rungs": rungs, "metric": metric,
                    "points": drawn, "x": x}


def tune_figures(experiment_dir: Path, metric: str, mode: str, x: str, max_t: int | None, rungs: list[int],
                 scheduler: str | None) -> list:
    """The plots of any Tune experiment: learning curves of `metric` over `x`, and the search view."""
    trials = tune_trials(experiment_dir)
    return [("learning_curves.png", lambda: learning_curves(trials, metric, mode, max_t, rungs, x, scheduler)),
            ("search.png", lambda: search_view(trials, metric, mode, x))]


def _categorical(values: list) -> bool:
    return not all(isinstance(v, float) for v in values)


def hyperparameters(trials: list[Trial]) -> list[str]:
    """The searched keys of the trials' configs: scalar, and not one fixed value across trials."""
    keys = sorted({k for t in trials for k, v in t.params.items() if isinstance(v, (int, float, str, bool))})
    if len(trials) > 1:
        keys = [k for k in keys if len({json.dumps(t.params.get(k)) for t in trials}) > 1]
    return keys


def search_view(trials: list[Trial], metric: str, mode: str, x: str = "training_iteration"):
    """Each trial's final `metric` against each hyperparameter: floats on a log axis (lr, from a
    log-uniform), the rest (tune.choice) as categories; the best trial a red star."""
    finals = final_values(trials, metric, x)
    best = best_trial(finals, mode)
    keys = hyperparameters([t for t in trials if t.trial_id in finals]) or ["(none)"]
    cols = min(len(keys), 4)
    figure, axes = _figure(math.ceil(len(keys) / cols), cols, width=3.2 * cols, height=3.2 * math.ceil(len(keys) / cols))
    done = [t for t in trials if t.trial_id in finals]
    for ax, key in zip(axes, keys):
        values = [t.params.get(key) for t in done]
        ys = [finals[t.trial_id] for t in done]
        if _categorical(values):
            labels = sorted({json.dumps(v) for v in values}, key=lambda s: (len(s), s))
            xs = [labels.index(json.dumps(v)) for v in values]
            ax.set_xticks(range(len(labels)), [json.loads(s) if s.startswith('"') else s for s in labels])
        else:
            xs = values
            if all(v > 0 for v in values):
                ax.set_xscale("log")
        ax.scatter(xs, ys, color="tab:blue", alpha=0.7)
        for x, y, t in zip(xs, ys, done):
            if t.trial_id == best:
                ax.scatter([x], [y], color="tab:red", marker="*", s=160, zorder=3, label=f"best: {best}")
        ax.set(xlabel=key, ylabel=f"final {metric}")
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    if best is not None:
        axes[0].legend(fontsize=7)
    figure.suptitle(f"final {metric} of each trial against its hyperparameters")
    return figure, {"panels": keys, "points": len(done), "best": best, "metric": metric}


def training(rows: list[dict]):
    """A Ray Train run per epoch: train and val loss, val accuracy, samples/s."""
    figure, (loss, accuracy, speed) = _figure(1, 3, width=13, height=4)
    lines = {"loss": 0, "accuracy": 0, "throughput": 0}
    for ax, panel, keys in ((loss, "loss", ("train_loss", "val_loss")), (accuracy, "accuracy", ("val_accuracy",)),
                            (speed, "throughput", ("samples_per_s",))):
        for key in keys:
            points = series(rows, "epoch", key)
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, label=key)
                lines[panel] += 1
        ax.set(xlabel="epoch", ylabel=panel if panel != "throughput" else "samples/s", title=", ".join(keys))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    epochs = [int(x) for x, _ in series(rows, "epoch", "epoch")]
    return figure, {"lines": sum(lines.values()), "panels": lines, "epochs": epochs}


def reports(rows: list[dict], panels: int = 6):
    """A Ray Train run's reports: each number it reports (up to `panels`) against the epoch, or
    the report's index where it reports none."""
    x = "epoch" if rows and all("epoch" in r for r in rows) else "report"
    rows = [r if x == "epoch" else {**r, "report": i} for i, r in enumerate(rows, 1)]
    keys = sorted({k for r in rows for k, v in r.items() if k not in ("epoch", "report") and series([r], x, k)})[:panels]
    cols = min(max(len(keys), 1), 3)
    figure, axes = _figure(math.ceil(max(len(keys), 1) / cols), cols, width=4.3 * cols, height=3.6 * math.ceil(max(len(keys), 1) / cols))
    for ax, key in zip(axes, keys):
        ax.plot(*zip(*series(rows, x, key)), marker="o", markersize=3)
        ax.set(xlabel=x, ylabel=key, title=key)
        ax.grid(alpha=0.3)
    for ax in axes[len(keys):]:
        ax.set_visible(False)
    return figure, {"panels": keys, "x": x, "points": len(rows)}


RETURN, STEPS = "env_runners/episode_return_mean", "num_env_steps_sampled_lifetime"  # as in rayflow.workloads.rllib_parts


def returns(trials: list[Trial], goal: float | None, algorithm: str = "PPO"):
    """RLlib: episode return against env steps, one line per trial (its lr), the stop goal dashed."""
    figure, (ax,) = _figure()
    lrs, points = [], []
    for trial in sorted(trials, key=lambda t: (lookup(t.params, "lr") or 0, t.trial_id)):
        curve = series(trial.rows, STEPS, RETURN)
        if not curve:
            continue
        lr = lookup(trial.params, "lr")
        ax.plot(*zip(*curve), marker="o", markersize=3, label=f"lr={lr:g}" if isinstance(lr, (int, float)) else trial.trial_id)
        lrs.append(lr)
        points.append(len(curve))
    if goal is not None:
        ax.axhline(goal, color="tab:red", linestyle="--", linewidth=1, label=f"stop: return {goal:g}")
    ax.set(xlabel="env steps sampled", ylabel="episode_return_mean", title=f"{algorithm}: episode return per trial")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure, {"lines": len(lrs), "lrs": lrs, "points": points, "goal": goal}


def make_plots(figures: list, experiment_dir: Path) -> list[Path]:
    """Draw `figures` ((file name, a function returning (Figure, summary)) pairs: the workload's,
    rayflow.workloads.Workload.figures) into `<experiment_dir>/plots/`; returns the PNGs written.
    A plot that fails is left out with one warning line; it never fails the run."""
    folder = Path(experiment_dir) / FOLDER
    written = []
    for name, draw in figures:
        # Broad on purpose: a plot is a by-product of a run that has already finished; whatever
        # goes wrong drawing it (odd results, a matplotlib quirk) must not turn it into a failure.
        (folder / name).unlink(missing_ok=True)  # never leave an earlier run's picture as this one's
        try:
            figure, meta = draw()
            folder.mkdir(parents=True, exist_ok=True)
            written.append(save(figure, folder / name, meta))
        except Exception as err:  # noqa: BLE001
            warn(f"{name}: {type(err).__name__}: {err}")
    return written


def warn(message: str) -> None:
    print(f"rayflow: warning: plots: {message}", file=sys.stderr, flush=True)


def read_meta(png: Path) -> dict:
    """The summary a plot stored in its PNG (see save)."""
    from PIL import Image

    with Image.open(png) as image:
        return json.loads(image.text[META_KEY])
