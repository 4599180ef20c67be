"""What any Ray Train run of rayflow is made of: the TrainJob (the seam between a workload's keys
and Ray Train), the TorchTrainer it builds, the callback that keeps rank 0's reports, and the
summary of a run.

Ray 2.60 runs Ray Train V2: a Trainer is not handed to a Tuner any more; a Tune trial is a
function that builds a TorchTrainer and calls fit(), and TuneReportCallback forwards rank
0's reports to Tune. A Train run is resumed by running it again under the same
RunConfig(name, storage_path): Train reloads its checkpoint snapshot from that folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ray.train import UserCallback

from rayflow.results.storage import checkpoint_uri
from rayflow.tracking.mlflow_runs import log_step


@dataclass
class TrainJob:
    train_loop: Callable  # Ray Train's train_loop_per_worker(config)
    config: dict  # train_loop_config
    num_workers: int
    resources: dict  # per worker: Ray resource name -> amount (CPU, GPU, memory, custom)
    max_failures: int = 0
    num_to_keep: int | None = None
    score_attribute: str | None = None  # keep the best num_to_keep by this reported key
    score_order: str = "max"
    epochs: int | None = (
        None  # the reports a complete run makes, where known (the table, "interrupted")
    )

    @property
    def use_gpu(self) -> bool:
        return bool(self.resources.get("GPU"))


def trainer(job: TrainJob, name: str, storage: str, callbacks=(), config: dict | None = None):
    """The TorchTrainer of a job (gloo on CPU, NCCL on GPU), in `storage`/`name`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        job.train_loop,
        train_loop_config=job.config if config is None else config,
        torch_config=TorchConfig(backend="nccl" if job.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=job.num_workers,
            use_gpu=job.use_gpu,
            resources_per_worker=dict(job.resources),
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=job.max_failures),
            checkpoint_config=CheckpointConfig(
                num_to_keep=job.num_to_keep,
                checkpoint_score_attribute=job.score_attribute,
                checkpoint_score_order=job.score_order,
            ),
            callbacks=list(callbacks),
        ),
    )


class ReportLog(UserCallback):
    """Appends rank 0's reports, as JSON lines, to a file in the run's folder (Ray Train keeps no
    per-report results of its own; the plots and RunResult.trials read them, so a resumed run is
    drawn whole), and into the run's nested MLflow run when given one (`mlflow`: uri, run_id).
    It runs in Train's controller, which Ray places on the driver's node. A write that fails
    costs a point, never the run."""

    def __init__(self, path: str, mlflow: dict | None = None):
        self.path, self.mlflow = path, mlflow
        self.reports = 0

    def after_report(self, run_context, metrics, checkpoint):
        if not metrics:
            return
        self.reports += 1
        report = metrics[0]
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(report, default=str) + "\n")
        except OSError:
            pass
        if self.mlflow:
            step = report.get("epoch", self.reports)
            log_step(
                self.mlflow["uri"],
                self.mlflow["run_id"],
                report,
                step=int(step) if isinstance(step, (int, float)) else self.reports,
            )


@dataclass
class TrainSummary:
    final: dict  # rank 0's last report (numbers)
    best_checkpoint: str | None
    epochs: int | None  # the reports a complete run makes, where known
    score_attribute: str | None = None
    best_score: float | None = None
    errored: int = 0
    interrupted: bool = False  # stopped (Ctrl-C) before the end; resume=true continues
    devices: list[str] = field(default_factory=list)
    error: str | None = None  # why the worker group failed, one line
    best_config: dict = field(default_factory=dict)  # the config it ran with

    @property
    def best_metrics(self) -> dict:
        return {**self.final, **self.parent_metrics()}

    def parent_metrics(self) -> dict:
        metrics = {k: v for k, v in self.final.items() if k != "epoch"}
        if "epoch" in self.final:
            metrics["epochs_completed"] = int(self.final["epoch"])
        if self.best_score is not None:
            metrics[f"best_{self.score_attribute}"] = self.best_score
        return metrics

    def table(self) -> str:
        lines = ["", "== rayflow results (Ray Train) =="]
        if "epoch" in self.final:
            lines.append(
                f"epochs: {int(self.final['epoch'])}"
                + (f" of {self.epochs}" if self.epochs else "")
            )
        for key, value in self.final.items():
            if key != "epoch":
                lines.append(f"final {key:<14} {value:.4f}")
        if self.best_score is not None:
            lines.append(f"best  {self.score_attribute:<14} {self.best_score:.4f}")
        lines.append(f"best checkpoint: {self.best_checkpoint}")
        if self.errored:
            lines.append(
                "the run FAILED: the worker group ran out of restarts (workload.max_failures)"
            )
        return "\n".join(lines)


def summarize_result(
    result, job: TrainJob, errored: bool, interrupted: bool = False
) -> TrainSummary:
    raw = dict(result.metrics or {}) if result else {}
    final = {
        k: v for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    best = result.best_checkpoints if result and result.best_checkpoints else []
    score = job.score_attribute
    if score:
        pick = max if job.score_order == "max" else min
        scored = [pair for pair in best if isinstance(pair[1].get(score), (int, float))]
        top = pick(scored, key=lambda pair: pair[1][score]) if scored else None
    else:
        top = best[-1] if best else None
    done = int(final.get("epoch", 0))
    return TrainSummary(
        final=final,
        best_checkpoint=checkpoint_uri(top[0])
        if top
        else (checkpoint_uri(result.checkpoint) if result and result.checkpoint else None),
        epochs=job.epochs,
        score_attribute=score,
        best_score=top[1].get(score) if top and score else None,
        errored=int(errored),
        interrupted=interrupted
        or (not errored and job.epochs is not None and "epoch" in final and done < job.epochs),
        devices=[str(raw["device"])] if "device" in raw else [],
    )
