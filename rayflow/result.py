"""What a run gives back to Python (rayflow.run): its outcome, where it went, its trials.

The CLI prints the same summary as a table; a notebook gets the numbers, the MLflow ids and
the experiment folder as values, the trials as a pandas DataFrame, and `.resume()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable



def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RunResult:
    """One job's outcome. `summary`: the workload's (rayflow.workloads.Summary: TuneSummary, TrainSummary, RLlibSummary)."""

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
        """The best trial's config; for one Ray Train run, the config it ran with."""
        return dict(self.summary.best_config) if self.summary is not None else {}

    @property
    def best_metrics(self) -> dict:
        """The best trial's last metrics (Tune); the last report (one Train run); the best return (RLlib)."""
        return dict(self.summary.best_metrics) if self.summary is not None else {}

    @property
    def trials(self):
        """One row per trial (config keys, then each metric's last value), as a pandas DataFrame
        where pandas is installed, else a list of dicts. One Ray Train run: one row per report."""
        from omegaconf import OmegaConf

        from rayflow.plots_data import TUNE_AUTO_KEYS, lookup, train_epochs, tune_trials
        from rayflow.workloads import workload_for

        cfg = OmegaConf.create(self.config)
        workload = workload_for(cfg.workload)
        metrics, params = workload.metrics(cfg), workload.params(cfg)
        rows = []
        for trial in tune_trials(self.experiment_dir):
            last = trial.rows[-1] if trial.rows else {}
            names = metrics or {k: k for k, v in last.items() if k not in TUNE_AUTO_KEYS and _number(v)}
            row = {"trial_id": trial.trial_id}
            row |= {k: v for k, v in trial.params.items() if params is None or k in params}
            row |= {name: lookup(last, key) for name, key in names.items()}
            row |= {"iterations": last.get("training_iteration"), "done": trial.done}
            rows.append(row)
        if not rows:  # a single Ray Train run: its reports
            for report in train_epochs(self.experiment_dir):
                names = metrics or {k: k for k, v in report.items() if _number(v)}
                rows.append({name: lookup(report, key) for name, key in names.items()})
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
