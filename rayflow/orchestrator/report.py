"""A run's outcome, told: into its MLflow parent run (tags, metrics, the best checkpoint, the plots)
and onto the terminal (the results table, the plots' folder, how to continue it, where MLflow is).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rayflow.results.experiment import Experiment
from rayflow.runtime.node_usage import NodePeak
from rayflow.runtime.ray_logs import settle_ray_logs
from rayflow.tracking.tracker import Tracker


def report(
    cfg: DictConfig,
    tracker: Tracker,
    summary: Any,
    experiment: Experiment,
    peak: NodePeak,
    workload: Any,
) -> None:
    """The outcome into the parent run and onto the terminal."""
    tags = {"device": ",".join(summary.devices) or cfg.compute.device}
    if summary.best_checkpoint:  # where it lives: the experiment's folder or object store
        tags["best_checkpoint"] = str(summary.best_checkpoint)
    tracker.set_tags(tags)
    tracker.log_metrics({**summary.parent_metrics(), **peak.metrics()})
    if summary.best_checkpoint and cfg.tracking.get("log_best_checkpoint", False):
        best_checkpoint_copy(tracker, str(summary.best_checkpoint))
    settle_ray_logs()  # Ray's held-back worker lines above the results, not below them
    print(summary.table(), flush=True)
    plots(cfg, tracker, experiment, workload)
    where = experiment.location
    # a workload rayflow runs for another entry point says how that one continues it
    again = getattr(workload, "RESUME", None) or f"resume={where}"
    print(f"experiment: {where}   (continue it with {again})")
    print(f"MLflow: {tracker.ui_hint()}", flush=True)
    print(f"cluster nodes at peak: {peak.peak}", flush=True)


def best_checkpoint_copy(tracker: Tracker, where: str) -> None:
    """The best checkpoint copied into the parent run (`best_checkpoint/`): from its folder, or
    fetched from its object store first."""
    import tempfile

    from rayflow.results import storage

    if not storage.is_uri(where):
        tracker.log_artifacts(where, "best_checkpoint")
        return
    with tempfile.TemporaryDirectory(prefix="rayflow-best-") as local:
        storage.pull(where, Path(local), skip=lambda _: False)
        tracker.log_artifacts(local, "best_checkpoint")


def plots(cfg: DictConfig, tracker: Tracker, experiment: Experiment, workload: Any) -> None:
    """The run's plots (rayflow.results.plots), drawn from its experiment folder now that the run is
    over, into `<path>/plots/` and the parent run's `plots/`; their place goes under the results
    table."""
    path = experiment.dir
    try:
        from rayflow.results.plots.make import FOLDER, make_plots

        files = make_plots(workload.figures(cfg, path), path)
        if files:
            tracker.log_artifacts(str(path / FOLDER), FOLDER)
            experiment.push(FOLDER)
    # Broad on purpose: the run itself is done; a plot (matplotlib, an odd result, the upload)
    # that fails costs the plot and one warning line, never the run's outcome.
    except Exception as err:  # noqa: BLE001
        print(f"rayflow: warning: plots: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return
    if files:
        where = f"; MLflow: {FOLDER}/ of the parent run {tracker.run_id}" if tracker.run_id else ""
        print(f"plots: {path / FOLDER}/ ({', '.join(f.name for f in files)}){where}", flush=True)
