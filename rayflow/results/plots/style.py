"""How a trial looks in every plot, and which trial is the best.

Each trial keeps one colour and one marker in every plot, so overlapping trials stay apart and a
trial is found again from one plot to the next; curves that come near one another are set side
by side. A trial's legend name says what sets it apart (best, stopped early, unfinished), and an
unfinished one is drawn hollow. The best trial (by each trial's last value) is marked in red in
every plot, so the curves and the search view share how it is picked.
"""

from __future__ import annotations

from itertools import pairwise

from rayflow.results.records import FINISHED, Trial, series

# Red is the best trial's mark, left out here.
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


def unfinished(trial: Trial) -> bool:
    """An unfinished trial (interrupted, errored): its last value is not a final one; drawn
    hollow."""
    return trial.status is not None and trial.status != FINISHED


def legend_label(trial: Trial, best: str | None, early: bool = False) -> str:
    """A trial's name in a legend, with what sets it apart: best, stopped early, unfinished."""
    label = (
        trial.trial_id
        + (" (best)" if trial.trial_id == best else "")
        + (" (stopped)" if early else "")
    )
    return label + (
        (" (errored)" if trial.errored else " (unfinished)") if unfinished(trial) else ""
    )
