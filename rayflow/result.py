"""What a run gives back to Python (rayflow.run): its outcome, where it went, its trials.

The CLI prints the same summary as a table; a notebook gets the numbers, the MLflow ids and
the experiment folder as values, the trials as a pandas DataFrame, and `.resume()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Tune's bookkeeping in every result line; not what a trial table is read for.
_TUNE_KEYS = ("trial_id", "training_iteration", "done")


class RunFailed(RuntimeError):
    """The run started but could not finish: trials errored, or a demand could never be placed.
    The CLI prints the message as one line and exits 1. `.result`: what the run left (resumable)."""

    def __init__(self, message: str, result: "RunResult | None" = None):
        super().__init__(message)
        self.result = result


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (a notebook's interrupt) stopped the run; what it started is torn down and its
    state saved: `.result.resume()` continues it. The CLI prints the message and exits 130."""

    def __init__(self, message: str, result: "RunResult | None" = None):
        super().__init__(message)
        self.result = result


def first_error_line(error: BaseException | str | None) -> str | None:
    """The line of a trial's error a user acts on: the exception itself, the last line of a
    remote traceback (Ray wraps a trial's exception in RayTaskError with the whole traceback)."""
    if error is None:
        return None
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


@dataclass
class RunResult:
    """One job's outcome. `summary` is the workload's own (TuneSummary, TrainSummary, PPOSummary)."""

    workload: str
    summary: Any
    experiment_dir: Path
    overrides: tuple[str, ...] = ()
    config: dict = field(default_factory=dict, repr=False)  # the job's composed config (secrets masked)
    tracking_uri: str | None = None
    mlflow_experiment: str | None = None
    mlflow_experiment_id: str | None = None
    mlflow_run_id: str | None = None  # the parent run; trials are its nested runs

    @property
    def interrupted(self) -> bool:
        return bool(getattr(self.summary, "interrupted", False))

    @property
    def best_config(self) -> dict:
        """The best trial's config (cifar, ddp with tune=true, ppo's lr); for one Train run, the
        training keys it ran with."""
        best = getattr(self.summary, "best_config", None)
        if best is not None:
            return dict(best)
        return {k: v for k, v in self.config.get("workload", {}).items() if not isinstance(v, (dict, list))}

    @property
    def best_metrics(self) -> dict:
        """The best trial's last metrics (Tune); the final epoch's (Train); the best return (PPO)."""
        summary = self.summary
        if hasattr(summary, "best_metrics"):
            return dict(summary.best_metrics)
        if hasattr(summary, "final"):
            return {**summary.final, **summary.parent_metrics()}
        return dict(summary.parent_metrics()) if summary is not None else {}

    @property
    def trials(self):
        """One row per trial (config keys, then each metric's last value), as a pandas DataFrame
        where pandas is installed, else a list of dicts. One Ray Train run: one row per epoch."""
        from rayflow.plots_data import lookup, train_epochs, tune_trials
        from rayflow.workloads import workload_for

        workload = workload_for(self.workload)
        metrics = workload.METRICS if isinstance(workload.METRICS, dict) else {m: m for m in workload.METRICS}
        params = getattr(workload, "PARAMS", None)
        rows = []
        for trial in tune_trials(self.experiment_dir):
            last = trial.rows[-1] if trial.rows else {}
            row = {"trial_id": trial.trial_id}
            row |= {k: v for k, v in trial.params.items() if params is None or k in params}
            row |= {name: lookup(last, key) for name, key in metrics.items()}
            row |= {"iterations": last.get("training_iteration"), "done": trial.done}
            rows.append(row)
        if not rows:  # a single Ray Train run: its epochs
            rows = [{name: row.get(name) for name in metrics} for row in train_epochs(self.experiment_dir)]
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)

    def resume(self) -> "RunResult":
        """Continue this experiment (finished trials are not repeated), as `resume=<folder>`."""
        from rayflow.api import run

        kept = [o for o in self.overrides if not o.split("=", 1)[0].lstrip("+~") == "resume"]
        return run(*kept, f"resume={self.experiment_dir}")

    def __repr__(self) -> str:
        lines = [self.summary.table().strip() if self.summary is not None else "(no summary)"]
        lines.append(f"experiment: {self.experiment_dir}")
        if self.mlflow_run_id:
            lines.append(f"MLflow: experiment {self.mlflow_experiment!r}, parent run {self.mlflow_run_id} ({self.tracking_uri})")
        return "\n".join(lines)
