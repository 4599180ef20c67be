"""What a run gives back to Python (rayflow.run): its outcome, where it went, its trials.

The CLI prints the same summary as a table; a notebook gets the numbers, the MLflow ids and
the experiment folder as values, the trials as a pandas DataFrame, and `.resume()`.

A run submitted to a cluster (vm, kuberay) is rayflow itself on the head: its job ends by
printing one line, `RESULT_MARKER` + a MAC + JSON (`result_line`, rayflow.security.result_channel:
signed with the key of this one submission), the last thing it knows of its RunResult. This side
reads that line from the log of a job that SUCCEEDED before the cluster goes (`returned_result`), so
a submitted run returns the same RunResult as a local one; its summary is a `ReturnedSummary` and
its trials come as rows (the experiment folder is on the head). A line without a valid MAC is
ignored; nothing in the line is ever run as code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rayflow.security import result_channel
from rayflow.security.redaction import mask_text

# The line a submitted job ends with (never streamed to the user's terminal;
# rayflow.orchestrator.submission).
RESULT_MARKER = "[rayflow-result] "


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class RunResult:
    """One job's outcome. `summary`: the workload's (rayflow.workloads.Summary: TuneSummary,
    TrainSummary, RLlibSummary)."""

    workload: str
    summary: Any
    experiment_dir: Path
    overrides: tuple[str, ...] = ()
    # the job's composed config (secrets masked)
    config: dict = field(default_factory=dict, repr=False)
    tracking_uri: str | None = None
    mlflow_experiment: str | None = None
    mlflow_experiment_id: str | None = None
    mlflow_run_id: str | None = None  # the parent run; trials are its nested runs
    # What `resume()` calls: the entry point that returned this result (rayflow.run) sets it,
    # so this module, below the entry points, never imports them.
    runner: Callable[..., Any] | None = field(default=None, repr=False, compare=False)
    # A submitted run's trials, as the job on the head read them from its experiment folder.
    trial_rows: list[dict] | None = field(default=None, repr=False)
    # What a trial's row holds, as its workload says (rayflow.workloads.Workload.metrics and
    # params): name -> result key of each metric (None: every number), the config keys (None: all
    # of them).
    trial_metrics: dict[str, str] | None = field(default=None, repr=False)
    trial_params: tuple[str, ...] | None = field(default=None, repr=False)
    # Where the experiment lives, what `resume=` takes: its folder, or its object-store URI (then
    # experiment_dir is a local mirror of it, checkpoints left out).
    experiment: str = ""

    @property
    def location(self) -> str:
        return self.experiment or str(self.experiment_dir)

    @property
    def interrupted(self) -> bool:
        return bool(getattr(self.summary, "interrupted", False))

    @property
    def best_config(self) -> dict:
        """The best trial's config; for one Ray Train run, the config it ran with."""
        return dict(self.summary.best_config) if self.summary is not None else {}

    @property
    def best_metrics(self) -> dict:
        """The best trial's last metrics (Tune); the last report (one Train run); the best return
        (RLlib)."""
        return dict(self.summary.best_metrics) if self.summary is not None else {}

    @property
    def trials(self):
        """One row per trial (config keys, then each metric's last value), as a pandas DataFrame
        where pandas is installed, else a list of dicts. One Ray Train run: one row per report."""
        rows = self.trial_rows if self.trial_rows is not None else self._read_trials()
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)

    def _read_trials(self) -> list[dict]:
        from rayflow.results.records import TUNE_AUTO_KEYS, lookup, train_epochs, tune_trials

        metrics, params = self.trial_metrics, self.trial_params
        rows = []
        for trial in tune_trials(self.experiment_dir):
            last = trial.rows[-1] if trial.rows else {}
            names = metrics or {
                k: k for k, v in last.items() if k not in TUNE_AUTO_KEYS and _number(v)
            }
            row: dict[str, Any] = {"trial_id": trial.trial_id}
            row |= {k: v for k, v in trial.params.items() if params is None or k in params}
            row |= {name: lookup(last, key) for name, key in names.items()}
            row |= {"iterations": last.get("training_iteration"), "done": trial.done}
            rows.append(row)
        if not rows:  # a single Ray Train run: its reports
            for report in train_epochs(self.experiment_dir):
                names = metrics or {k: k for k, v in report.items() if _number(v)}
                rows.append({name: lookup(report, key) for name, key in names.items()})
        return rows

    def resume(self) -> RunResult:
        """Continue this experiment (finished trials are not repeated), as `resume=<folder>`."""
        if self.runner is None:
            raise RuntimeError(
                "this result did not come from rayflow.run; continue it with "
                f"python -m rayflow resume={self.location}"
            )
        kept = [o for o in self.overrides if o.split("=", 1)[0].lstrip("+~") != "resume"]
        return self.runner(*kept, f"resume={self.location}")

    def __repr__(self) -> str:
        lines = [self.summary.table().strip() if self.summary is not None else "(no summary)"]
        lines.append(f"experiment: {self.location}")
        if self.mlflow_run_id:
            lines.append(
                f"MLflow: experiment {self.mlflow_experiment!r}, parent run {self.mlflow_run_id} "
                f"({self.tracking_uri})"
            )
        # the tracking URI's password, a secret in a config value shown
        return mask_text("\n".join(lines))


@dataclass
class ReturnedSummary:
    """A workload's Summary as a submitted job sent it back (rayflow.workloads.Summary)."""

    best_config: dict = field(default_factory=dict)
    best_metrics: dict = field(default_factory=dict)
    best_checkpoint: str | None = None  # a path on the cluster's storage
    interrupted: bool = False
    errored: int = 0
    error: str | None = None
    devices: list[str] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)  # what the parent MLflow run recorded
    text: str = ""  # the results table the job printed

    @classmethod
    def of(cls, summary: Any) -> ReturnedSummary:
        return cls(
            dict(summary.best_config),
            dict(summary.best_metrics),
            summary.best_checkpoint,
            bool(summary.interrupted),
            int(summary.errored),
            summary.error,
            list(summary.devices),
            dict(summary.parent_metrics()),
            summary.table(),
        )

    def parent_metrics(self) -> dict[str, float]:
        return dict(self.metrics)

    def table(self) -> str:
        return self.text


def _plain(value: Any) -> Any:
    """JSON for what results hold besides JSON's own types (numpy numbers, paths)."""
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return str(value)


def _finite(value: Any) -> Any:
    """NaN and infinities as None (a trial that reported none), so the line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def result_line(result: RunResult, status: str) -> str:
    """The line a submitted job ends with: what this side needs to rebuild `result`, signed with
    the key this job's driver took at its start (result_channel.take_key). A process that holds
    no key (not a job rayflow submitted) says so instead: nothing would believe the line."""
    rows = None
    if result.summary is not None and Path(result.experiment_dir).is_dir():
        try:
            trials = result.trials
            rows = trials.to_dict("records") if hasattr(trials, "to_dict") else list(trials)
        except (OSError, ValueError) as err:  # a result file cut short: the summary still goes back
            print(
                f"rayflow: warning: the trials could not be read back: {type(err).__name__}: {err}",
                flush=True,
            )
    data = {
        "status": status,
        "experiment_dir": str(result.experiment_dir),
        "experiment": result.location,
        "mlflow_experiment_id": result.mlflow_experiment_id,
        "mlflow_run_id": result.mlflow_run_id,
        "summary": asdict(ReturnedSummary.of(result.summary))
        if result.summary is not None
        else None,
        "trials": rows,
    }
    # numpy and paths as plain values first, then NaN as null
    text = json.dumps(data, default=_plain)
    line = result_channel.signed_line(RESULT_MARKER, _finite(json.loads(text)))
    return (
        line
        if line is not None
        else "[rayflow] no result key in this job's environment: no result line"
    )


def returned_result(log: str, base: RunResult, key: bytes) -> tuple[RunResult, str | None]:
    """`base` (this side's workload, overrides, config and tracking) completed from the result
    line in a submitted job's `log` that `key` verifies, and the status the job gave it (None:
    the job ended before it could say, e.g. a traceback before the run began). Call it only for
    a job that SUCCEEDED (rayflow.security.result_channel)."""
    data = result_channel.read(log, RESULT_MARKER, key)
    if not isinstance(data, dict):
        return base, None
    base.experiment_dir = Path(data["experiment_dir"])
    base.experiment = str(data.get("experiment") or data["experiment_dir"])
    base.mlflow_experiment_id, base.mlflow_run_id = (
        data["mlflow_experiment_id"],
        data["mlflow_run_id"],
    )
    base.summary = ReturnedSummary(**data["summary"]) if data["summary"] is not None else None
    base.trial_rows = data["trials"]
    return base, data["status"]


def returned_mlflow_run(log: str, key: bytes) -> tuple[str | None, str | None]:
    """A FAILED job's parent MLflow run (experiment id, run id) from its signed result line, and
    nothing else of it: where this side stores the job's log, so a failed job keeps one parent
    run. The failed job's result itself is not returned."""
    data = result_channel.read(log, RESULT_MARKER, key)
    if not isinstance(data, dict):
        return None, None
    ids = data.get("mlflow_experiment_id"), data.get("mlflow_run_id")
    return (ids[0], ids[1]) if all(v is None or isinstance(v, str) for v in ids) else (None, None)


def without_result_line(log: str) -> str:
    return result_channel.without(log, RESULT_MARKER)
