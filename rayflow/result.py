"""What a run gives back to Python (rayflow.run): its outcome, where it went, its trials.

The CLI prints the same summary as a table; a notebook gets the numbers, the MLflow ids and
the experiment folder as values, the trials as a pandas DataFrame, and `.resume()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# Tune's bookkeeping in every result line; not what a trial table is read for.
_TUNE_KEYS = ("trial_id", "training_iteration", "done")


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
    # What `resume()` calls: the entry point that returned this result (rayflow.run) sets it,
    # so this module, below the entry points, never imports them.
    runner: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

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
        if self.runner is None:
            raise RuntimeError(f"this result did not come from rayflow.run; continue it with "
                               f"python -m rayflow resume={self.experiment_dir}")
        kept = [o for o in self.overrides if not o.split("=", 1)[0].lstrip("+~") == "resume"]
        return self.runner(*kept, f"resume={self.experiment_dir}")

    def __repr__(self) -> str:
        lines = [self.summary.table().strip() if self.summary is not None else "(no summary)"]
        lines.append(f"experiment: {self.experiment_dir}")
        if self.mlflow_run_id:
            lines.append(f"MLflow: experiment {self.mlflow_experiment!r}, parent run {self.mlflow_run_id} ({self.tracking_uri})")
        return "\n".join(lines)
