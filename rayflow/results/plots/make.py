"""A run's plots made: drawn, written as PNGs into `<experiment>/plots/`, and read back.

make_plots draws the figures a workload names (rayflow.workloads.Workload.figures) and writes
each with its summary as JSON in the PNG's "rayflow" text chunk (read_meta reads it back); a plot
that fails or draws nothing is left out, never failing the run. tune_figures is the list every
Tune experiment gets (the learning curves and the search view), so it sits with what draws it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayflow.results.plots.canvas import Figures
from rayflow.results.plots.curves import learning_curves
from rayflow.results.plots.search import search_view
from rayflow.results.records import Trial, trial_statuses, tune_trials

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FOLDER = "plots"  # in the experiment folder, and the parent MLflow run's artifact path
META_KEY = "rayflow"


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


def save(figure: Figure, path: Path, meta: dict[str, Any]) -> Path:
    figure.savefig(path, format="png", dpi=100, metadata={META_KEY: json.dumps(meta)})
    return path


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
