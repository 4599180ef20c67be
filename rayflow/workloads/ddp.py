"""workload=ddp: data-parallel training with Ray Train; this is the driver side: the checks, one
Ray Train run or an ASHA sweep of them, and the summary. What runs in every worker is
rayflow.workloads.ddp_loop.

Ray 2.60 runs Ray Train V2: a Trainer is not handed to a Tuner any more; a Tune trial is a
function that builds a TorchTrainer and calls fit(), and TuneReportCallback forwards rank
0's reports to Tune. A Train run is resumed by running it again under the same
RunConfig(name, storage_path): Train reloads its checkpoint snapshot from that folder.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ray.train import UserCallback

from rayflow.mlflow_runs import create_nested_run
from rayflow.placement import Bundle, section_bundle
from rayflow.plots_data import EPOCHS_FILE, SWEEP_METRIC, SWEEP_MODE
from rayflow.process_state import termination_exit_code
from rayflow.tuning import read_state, write_state
from rayflow.workloads.ddp_loop import METRICS, loop_config, train_loop

USES_DATA = True
WORKER_IMPORTS = ()  # none preloaded: every new worker would import them, Ray Train's controller (no torch) too
SCHEDULES = ("cosine", "step", "constant")


def check(cfg) -> None:
    """Every key of workload=ddp is checked by its schema (rayflow.schema.workloads.Ddp)."""


def demand(cfg) -> list[Bundle]:
    """One Train run: num_workers workers at once (the controller and a sweep's trial take no CPU)."""
    return [section_bundle(cfg, "a Train worker", "workload.resources_per_worker",
                           count=int(cfg.workload.num_workers), count_key="workload.num_workers")]




class EpochLog(UserCallback):
    """Appends rank 0's report of each epoch, as a JSON line, to EPOCHS_FILE in the run's folder:
    Ray Train keeps no per-epoch results of its own, and the plots (rayflow.plots) read them from
    there, so a resumed run is drawn whole. It runs in Train's controller, which Ray places on the
    driver's node; a write that fails costs a plot point, never the run."""

    def __init__(self, path: str):
        self.path = path

    def after_report(self, run_context, metrics, checkpoint):
        if not metrics:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(metrics[0], default=str) + "\n")
        except OSError:
            pass


def trainer_spec(cfg) -> dict:
    """The Ray Train settings of a run, as plain values (a Tune trial carries them)."""
    w = cfg.workload
    return {
        "num_workers": int(w.num_workers),
        "cpu": float(w.resources_per_worker.cpu),
        "gpu": float(w.resources_per_worker.gpu or 0),
        "memory": int(w.resources_per_worker.get("memory") or 0),
        "max_failures": int(w.max_failures),
        "keep_best": int(w.checkpoint.keep_best),
    }


def make_trainer(spec: dict, config: dict, name: str, storage: str, callbacks=()):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    resources = {"CPU": spec["cpu"], **({"GPU": spec["gpu"]} if spec["gpu"] else {}),
                 **({"memory": spec["memory"]} if spec.get("memory") else {})}
    return TorchTrainer(
        train_loop,
        train_loop_config=config,
        torch_config=TorchConfig(backend="nccl" if spec["gpu"] else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=spec["num_workers"], use_gpu=spec["gpu"] > 0, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=spec["max_failures"]),
            checkpoint_config=CheckpointConfig(
                num_to_keep=spec["keep_best"], checkpoint_score_attribute="val_accuracy", checkpoint_score_order="max"
            ),
            callbacks=list(callbacks),
        ),
    )


@dataclass
class TrainSummary:
    final: dict  # metrics of the last checkpointed epoch (every run checkpoints its last epoch)
    best_val_accuracy: float | None
    best_checkpoint: str | None
    epochs: int
    errored: int = 0
    interrupted: bool = False  # stopped (Ctrl-C) before the last epoch; resume=true continues
    devices: list[str] = field(default_factory=list)
    error: str | None = None  # why the worker group failed, one line

    def parent_metrics(self) -> dict:
        keys = ("val_accuracy", "val_loss", "train_loss", "samples_per_s")
        metrics = {k: self.final[k] for k in keys if k in self.final}
        metrics["epochs_completed"] = int(self.final.get("epoch", 0))
        if self.best_val_accuracy is not None:
            metrics["best_val_accuracy"] = self.best_val_accuracy
        return metrics

    def table(self) -> str:
        lines = ["", "== rayflow results (Ray Train) =="]
        lines.append(f"epochs: {int(self.final.get('epoch', 0))} of {self.epochs}")
        for key in ("val_accuracy", "val_loss", "train_loss", "samples_per_s"):
            if key in self.final:
                lines.append(f"final {key:<14} {self.final[key]:.4f}")
        if self.best_val_accuracy is not None:
            lines.append(f"best  val_accuracy   {self.best_val_accuracy:.4f}")
        lines.append(f"best checkpoint: {self.best_checkpoint}")
        if self.errored:
            lines.append("the run FAILED: the worker group ran out of restarts (workload.max_failures)")
        return "\n".join(lines)


def summarize_result(result, epochs: int, errored: bool) -> TrainSummary:
    final = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float, str))} if result else {}
    best = result.best_checkpoints if result and result.best_checkpoints else []
    top = max(best, key=lambda pair: pair[1].get("val_accuracy", 0.0)) if best else None
    done = int(final.get("epoch", 0))
    return TrainSummary(
        final={k: v for k, v in final.items() if not isinstance(v, str)},
        best_val_accuracy=top[1].get("val_accuracy") if top else None,
        best_checkpoint=top[0].path if top else None,
        epochs=epochs,
        errored=int(errored),
        interrupted=not errored and done < epochs,
        devices=[final["device"]] if "device" in final else [],
    )


def run_training(cfg, ctx) -> TrainSummary:
    """One Ray Train run in the experiment folder; its epochs go to a nested MLflow run."""
    from ray.train import Result, TrainingFailedError

    from rayflow.errors import first_error_line

    path: Path = ctx.experiment_dir
    state = read_state(path)
    config = loop_config(cfg, ctx.data)
    tracker = ctx.tracker
    run_id = state.get("train_run_id") if ctx.resume else None
    if tracker.run_id and run_id is None:
        params = {k: v for k, v in config.items() if k not in ("data", "mlflow")} | trainer_spec(cfg)
        run_id = create_nested_run(tracker.client, tracker.experiment_id, tracker.run_id, "train", params)
        write_state(path, {**state, "train_run_id": run_id})
    if run_id:
        tracker.client.update_run(run_id, status="RUNNING")
        config["mlflow"] = {"uri": tracker.absolute_uri, "run_id": run_id}
    trainer = make_trainer(trainer_spec(cfg), config, name=path.name, storage=str(path.parent),
                           callbacks=[EpochLog(str(path / EPOCHS_FILE))])
    errored, error = False, None
    try:
        result = trainer.fit()
    except TrainingFailedError as err:
        print(f"rayflow: Ray Train failed: {err}", file=sys.stderr, flush=True)
        result, errored, error = Result.from_path(str(path)), True, first_error_line(err)
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C: Ray Train's own SIGINT handler aborts the run and exits through ray.get
        # (SystemExit). Its checkpoints are saved; report what they hold. SIGTERM goes on up.
        if termination_exit_code():
            if run_id:
                tracker.client.set_terminated(run_id, "KILLED")
            raise
        result = Result.from_path(str(path))
    summary = summarize_result(result, int(cfg.workload.epochs), errored)
    summary.error = error
    name = ((result.metrics or {}) if result else {}).get("device_name")  # what the workers reported
    if name:
        tracker.set_tags({"device_name": name})
    if run_id:
        if name:
            tracker.client.set_tag(run_id, "device_name", name)
        status = "KILLED" if summary.interrupted else "FAILED" if errored else "FINISHED"
        tracker.client.set_terminated(run_id, status)
    return summary


def train_trial(config: dict, base: dict, spec: dict, storage: str) -> None:
    """One Tune trial: a whole Ray Train run with the trial's lr; Train's reports go to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    trainer = make_trainer(spec, {**base, "lr": config["lr"]}, f"train-{trial_id}", storage, [TuneReportCallback()])
    trainer.fit()


def run_sweep(cfg, ctx):
    """ASHA over the learning rate; each trial trains on num_workers Ray Train workers."""
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from rayflow.tuning import TuneJob, run_tune, summarize

    w = cfg.workload
    spec = trainer_spec(cfg)
    epochs, samples = int(w.epochs), int(w.sweep.num_samples)
    # A trial only waits on its Train run; its workers hold the resources. Run as many
    # trials at once as the cluster has room for their workers.
    free = ray.cluster_resources().get("CPU", 1) // (spec["cpu"] * spec["num_workers"])
    job = TuneJob(
        trainable=tune.with_parameters(train_trial, base=loop_config(cfg, ctx.data), spec=spec, storage=str(ctx.experiment_dir)),
        param_space={"lr": tune.loguniform(float(w.sweep.lr.min), float(w.sweep.lr.max))},
        metric=SWEEP_METRIC,
        mode=SWEEP_MODE,
        num_samples=samples,
        resources={"cpu": 0, "memory": 1},  # Tune wants a non-empty request; 1 byte is not a CPU
        scheduler=ASHAScheduler(
            time_attr="epoch", max_t=epochs,
            grace_period=int(w.sweep.grace_period), reduction_factor=int(w.sweep.reduction_factor),
        ),
        reuse_actors=False,  # a stopped trial's actor goes, and with it its Train workers
        max_concurrent_trials=max(1, int(free)),
        callbacks=[cb for cb in [ctx.tracker.trial_callback(METRICS, epochs)] if cb],
    )
    results, interrupted = run_tune(job, ctx.experiment_dir, resume=ctx.resume)
    summary = summarize(results, job.metric, job.mode, epochs, samples, interrupted)
    if summary.best_config:  # the trial's checkpoints live in its Train run's folder
        best = results.get_best_result(metric=job.metric, mode=job.mode, scope="last")
        summary.best_checkpoint = (best.metrics or {}).get("checkpoint_path")
    return summary


def run(cfg, ctx):
    return run_sweep(cfg, ctx) if cfg.workload.tune else run_training(cfg, ctx)
