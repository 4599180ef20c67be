"""A run's outcome, told: into its MLflow parent run (tags, metrics, the best checkpoint, the plots)
and onto the terminal (the results table, the plots' folder, how to continue it, where MLflow is).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rayflow.runtime.node_usage import NodePeak
from rayflow.runtime.progress import settle_ray_logs
from rayflow.tracking.tracker import Tracker


def report(
    cfg: DictConfig, tracker: Tracker, summary: Any, path: Path, peak: NodePeak, workload: Any
) -> None:
    """The outcome into the parent run and onto the terminal."""
    tracker.set_tags({"device": ",".join(summary.devices) or cfg.compute.device})
    tracker.log_metrics({**summary.parent_metrics(), **peak.metrics()})
    if summary.best_checkpoint and cfg.tracking.get("log_best_checkpoint", False):
        tracker.log_artifacts(summary.best_checkpoint, "best_checkpoint")
    settle_ray_logs()  # Ray's held-back worker lines above the results, not below them
    print(summary.table(), flush=True)
    plots(cfg, tracker, path, workload)
    print(f"experiment: {path}   (continue it with resume={path})")
    print(f"MLflow: {tracker.ui_hint()}", flush=True)
    print(f"cluster nodes at peak: {peak.peak}", flush=True)


def plots(cfg: DictConfig, tracker: Tracker, path: Path, workload: Any) -> None:
    """The run's plots (rayflow.results.plots), drawn from its experiment folder now that the run is
    over, into `<path>/plots/` and the parent run's `plots/`; their place goes under the results
    table."""
    try:
        from rayflow.results.plots import FOLDER, make_plots

        files = make_plots(workload.figures(cfg, path), path)
        if files:
            tracker.log_artifacts(str(path / FOLDER), FOLDER)
    # Broad on purpose: the run itself is done; a plot (matplotlib, an odd result, the upload)
    # that fails costs the plot and one warning line, never the run's outcome.
    except Exception as err:  # noqa: BLE001
        print(f"rayflow: warning: plots: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return
    if files:
        where = f"; MLflow: {FOLDER}/ of the parent run {tracker.run_id}" if tracker.run_id else ""
        print(f"plots: {path / FOLDER}/ ({', '.join(f.name for f in files)}){where}", flush=True)
