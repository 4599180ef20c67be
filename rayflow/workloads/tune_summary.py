"""The end of a Tune experiment: its summary (`summarize` -> `TuneSummary`), the results table it
prints and the numbers the parent MLflow run records, whatever the trainable.

Kept apart from running the experiment (rayflow.workloads.tune_runner): this reads a finished
ResultGrid, and RLlib's summary (rayflow.workloads.rllib_results) shares its one line for a run
with no best trial (`no_success_line`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayflow.results import storage
from rayflow.results.records import RAN_TO_END, TUNE_AUTO_KEYS
from rayflow.workloads.tune_runner import TuneJob


def no_success_line(
    trials: int, errored: int, error: str | None, interrupted: bool, metric: str = ""
) -> str:
    """The one line of a run with no best trial: why (every trial errored, with the first error;
    the interrupt; no report of the metric), in place of empty best-of headings."""
    what = f"reported {metric}" if metric else "reported a result"
    if errored:
        first = f"; the first error: {error}" if error else ""
        return f"no trial succeeded: {errored} of {trials} errored{first}"
    if interrupted:
        return f"no trial {what} before the interrupt ({trials} trials; resume continues them)"
    return f"no trial {what} ({trials} trials)"


@dataclass
class TuneSummary:
    """The outcome of a Tune experiment, whatever the trainable (rayflow.workloads.Summary)."""

    best_config: dict
    best_metrics: dict
    best_checkpoint: str | None
    trials: int
    errored: int
    interrupted: bool  # Ctrl-C stopped the experiment; its state is saved for resume
    stopped_early: int
    trial_epochs: int  # progress used by every trial together, in `unit`s
    budget_epochs: int  # 0: no budget known (no max_t)
    devices: list[str]
    error: str | None = None  # the first errored trial's error, one line
    metric: str = ""
    shown_metrics: tuple[str, ...] = ()
    scheduler_label: str | None = None
    unit: str = "epoch"
    restarted: int = 0  # trial restarts after a failure (a lost node), from their last checkpoint
    restart_reason: str | None = None  # the first failure's line
    reported_instead: tuple[str, ...] | None = None  # the metric was missing; these were there

    def parent_metrics(self) -> dict[str, float]:
        """What the invocation's parent MLflow run records about the whole search."""
        shown = self.shown_metrics or (self.metric,)
        best = {f"best_{k}": v for k, v in self.best_metrics.items() if k in shown}
        metrics = {
            **best,
            f"trial_{self.unit}s": self.trial_epochs,
            "trial_restarts": self.restarted,
        }
        if self.scheduler_label:
            metrics["trials_stopped_early"] = self.stopped_early
        return metrics

    def table(self) -> str:
        width = max(len(str(k)) for k in self.best_config) if self.best_config else 0
        lines = ["", "== rayflow results =="]
        # no trial reported the metric: no best trial, nothing under a heading
        if not self.best_metrics:
            return "\n".join([*lines, self._no_best_line()])
        if self.best_config:
            lines += [
                "best config:",
                *(f"  {k:<{width}} = {v}" for k, v in self.best_config.items()),
            ]
        for name in self.shown_metrics or (self.metric,):
            value = self.best_metrics.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"best {name:<13} {value:.4f}")
        by = f" by {self.scheduler_label}" if self.scheduler_label else ""
        if self.interrupted:
            lines.append(
                f"trials: {self.trials} ({self.errored} errored; interrupted before the search "
                "finished)"
            )
        elif self.scheduler_label:
            lines.append(
                f"trials: {self.trials} ({self.stopped_early} stopped early{by}, {self.errored} "
                "errored)"
            )
        else:
            lines.append(f"trials: {self.trials} ({self.errored} errored)")
        if self.budget_epochs:
            share = self.trial_epochs / self.budget_epochs
            lines.append(
                f"trial-{self.unit}s used: {self.trial_epochs} of {self.budget_epochs} "
                f"({share:.0%})"
            )
        else:
            lines.append(f"trial-{self.unit}s used: {self.trial_epochs}")
        return "\n".join([*lines, *self._restarts()])

    def _no_best_line(self) -> str:
        if self.reported_instead is not None:
            return f"no trial reported {self.metric} ({self.trials} trials); {self.reports_line()}"
        return no_success_line(self.trials, self.errored, self.error, self.interrupted, self.metric)

    def reports_line(self) -> str:
        keys = ", ".join(self.reported_instead or ()) or "only Tune's own counters"
        return f"they report: {keys}"

    def _restarts(self) -> list[str]:
        if not self.restarted:
            return []
        why = f"; the first failure: {self.restart_reason}" if self.restart_reason else ""
        return [f"trials restarted: {self.restarted} (each from its last checkpoint{why})"]


def _best_checkpoint(best) -> str | None:
    """Where the best trial's checkpoint is: a folder, or a URI on an object store. A trial that
    ran a Ray Train run reports where that run keeps its checkpoints."""
    if best is None:
        return None
    if best.checkpoint is None:
        return (best.metrics or {}).get("checkpoint_path")
    return storage.checkpoint_uri(best.checkpoint)


def summarize(
    results, job: TuneJob, interrupted: bool, restarts: tuple[int, str | None] = (0, None)
) -> TuneSummary:
    from rayflow.errors import first_error_line

    metric, mode, time_attr = job.metric, job.mode, job.time_attr
    done = [
        r for r in results if r.metrics and metric in r.metrics and r.error is None
    ]  # trials that reported
    best = results.get_best_result(metric=metric, mode=mode, scope="last") if done else None
    progress = [int((r.metrics or {}).get(time_attr, 0) or 0) for r in results]
    # With no limit set (the scheduler's default max_t is not one a trainable knows of), the
    # furthest any trial got is the limit: a trial that ended short of it was stopped early.
    max_t = job.max_t or (max(progress, default=0) or None if job.scheduler_label else None)
    numbers = (
        {
            k: v
            for k, v in (best.metrics or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in TUNE_AUTO_KEYS
        }
        if best
        else {}
    )
    return TuneSummary(
        best_config=dict(best.config) if best else {},
        best_metrics=numbers,
        best_checkpoint=_best_checkpoint(best),
        trials=len(results),
        errored=results.num_errors,
        interrupted=interrupted,
        stopped_early=sum(
            1
            for r in done
            if max_t
            and r.metrics.get(time_attr, max_t) < max_t
            and not r.metrics.get(RAN_TO_END)  # a trial that said it ran to its end
        )
        if job.scheduler_label
        else 0,
        trial_epochs=sum(progress),
        budget_epochs=len(results) * job.max_t
        if job.max_t
        else 0,  # grid_search multiplies num_samples
        devices=sorted({str(r.metrics["device"]) for r in done if "device" in r.metrics}),
        error=first_error_line(results.errors[0]) if results.errors else None,
        metric=metric,
        shown_metrics=job.shown_metrics,
        scheduler_label=job.scheduler_label,
        unit="epoch" if time_attr == "epoch" else "iteration",
        restarted=restarts[0],
        restart_reason=restarts[1],
        reported_instead=job.reported_instead,
    )
