r"""workload=train: the user's own Ray Train loop (`train_loop_per_worker`) on `num_workers`
workers, CPU or GPU from `compute`; or, with `sweep`, a Tune search whose every trial is a whole
Train run with sampled values in its `train_loop_config`.

    python -m rayflow workload=train workload.train_loop=loop:train_loop \
        workload.num_workers=4 compute=gpu

workload=ddp is this workload with rayflow's CIFAR loop and keys of its own
(rayflow.workloads.presets.ddp), run by `run_training` and `run_sweep`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import OmegaConf

from rayflow.results import storage
from rayflow.results.experiment import Experiment, read_state, write_state
from rayflow.results.records import EPOCHS_FILE
from rayflow.results.signing import sign_now
from rayflow.results.verification import check_unchanged
from rayflow.runtime.placement import Bundle
from rayflow.runtime.signals import termination_exit_code
from rayflow.schema.values import to_container
from rayflow.tracking.mlflow_runs import create_nested_run
from rayflow.workloads import user_code
from rayflow.workloads.train_runner import (
    ReportLog,
    TrainJob,
    TrainSummary,
    summarize_result,
    trainer,
)
from rayflow.workloads.tune_runner import TuneJob

KIND = "train"


def train_loop(cfg):
    return user_code.load(cfg.workload.train_loop, "workload.train_loop")


def worker_resources(section) -> dict:
    """Ray's resources per worker of a `resources_per_worker` section."""
    amounts = {"CPU": float(section.cpu)}
    if section.get("gpu"):
        amounts["GPU"] = float(section.gpu)
    if section.get("memory"):
        amounts["memory"] = int(section.memory)
    return {
        **amounts,
        **{k: float(v) for k, v in (to_container(section.get("custom")) or {}).items()},
    }


def job(cfg) -> TrainJob:
    w = cfg.workload
    checkpoint = w.get("checkpoint") or {}
    return TrainJob(
        train_loop=train_loop(cfg),
        config=to_container(w.get("train_loop_config")) or {},
        num_workers=int(w.num_workers),
        resources=worker_resources(w.resources_per_worker),
        max_failures=int(w.max_failures),
        num_to_keep=checkpoint.get("num_to_keep"),
        score_attribute=checkpoint.get("score_attribute"),
        score_order=str(checkpoint.get("score_order") or "max"),
    )


def check(cfg) -> None:
    from rayflow.workloads.tune_search import check_tune_parts

    train_loop(cfg)
    sweep = to_container(cfg.workload.get("sweep"))
    if sweep:
        check_tune_parts(sweep, prefix="workload.sweep")


def prepare(cfg, here: bool) -> None:
    """Nothing: the loop brings its own data."""


def worker_imports(cfg) -> tuple[str, ...]:
    return ()  # every new worker would import them, Ray Train's controller (no torch) too


def metrics(cfg) -> None:
    return None  # every number rank 0 reports


def params(cfg) -> None:
    return None


def demand(cfg) -> list[Bundle]:
    """One Train run: num_workers workers at once (the controller and a sweep's trial take no
    CPU)."""
    w = cfg.workload
    resources = worker_resources(w.resources_per_worker)
    prefix = "workload.resources_per_worker"
    keys = {
        "CPU": f"{prefix}.cpu",
        "GPU": f"{prefix}.gpu",
        "memory": f"{prefix}.memory",
        **{k: f"{prefix}.custom.{k}" for k in resources if k not in ("CPU", "GPU", "memory")},
    }
    return [
        Bundle(
            "a Train worker",
            resources,
            keys,
            count=int(w.num_workers),
            count_key="workload.num_workers",
        )
    ]


# Ray Train's own record of a run's checkpoints (ray.train.v2 CHECKPOINT_MANAGER_SNAPSHOT_FILENAME),
# which Result.from_path reads.
TRAIN_SNAPSHOT = "checkpoint_manager_snapshot.json"


def _saved_result(experiment: Experiment):
    """What the stopped Train run saved (ray.train.Result), or None: a run that failed before its
    first checkpoint leaves Ray Train no checkpoint snapshot to read a Result from."""
    from ray.train import Result

    return Result.from_path(experiment.location) if experiment.has(TRAIN_SNAPSHOT) else None


def run_training(train: TrainJob, ctx, mlflow_params: dict) -> TrainSummary:
    """One Ray Train run in the experiment folder; rank 0's reports go to a nested MLflow run."""
    path: Path = ctx.experiment_dir
    experiment: Experiment = ctx.experiment
    tracker = ctx.tracker
    run_id = _nested_run(ctx, mlflow_params)
    if ctx.resume and not any(path.glob("checkpoint_*")):  # Ray Train's own, in the run's folder
        print(
            "[rayflow] resume: the Train run saved no checkpoint (its train_loop reports none): it "
            "restarts from the start",
            flush=True,
        )
    mlflow = {"uri": tracker.absolute_uri, "run_id": run_id} if run_id else None
    fit = trainer(
        train,
        name=experiment.name,
        storage=storage.parent(experiment.location),
        callbacks=[ReportLog(str(path / EPOCHS_FILE), mlflow)],
    )
    if ctx.resume:  # what Train reloads (its snapshot, checkpoints) is as the resume verified it
        check_unchanged(experiment.location)
    try:
        ended = _fit(fit, experiment, tracker, run_id)
    finally:  # the reports rayflow logged beside Train's state (an object store: to it), signed
        experiment.push(EPOCHS_FILE)
        sign_now(experiment.location)
    summary = summarize_result(ended.result, train, ended.errored, ended.interrupted)
    summary.error = ended.error
    # what the workers reported
    name = ((ended.result.metrics or {}) if ended.result else {}).get("device_name")
    if name:
        tracker.set_tags({"device_name": name})
    if run_id:  # after the run: a tracking store that failed meanwhile is a warning (Tracker.write)
        status = "KILLED" if summary.interrupted else "FAILED" if ended.errored else "FINISHED"

        def end(client, _):
            if name:
                client.set_tag(run_id, "device_name", name)
            client.set_terminated(run_id, status)

        tracker.write("the Train run's end", end)
    return summary


def _nested_run(ctx, mlflow_params: dict) -> str | None:
    """The Train run's nested MLflow run, marked running: the one the resumed experiment started,
    else a new one under the parent run; None where there is none (tracking off)."""
    # read again, not the preflight's: the driver wrote the state since (its MLflow parent run)
    state = read_state(ctx.experiment)
    tracker = ctx.tracker
    run_id = state.get("train_run_id") if ctx.resume else None
    if tracker.run_id and run_id is None:
        run_id = create_nested_run(
            tracker.client, tracker.experiment_id, tracker.run_id, "train", mlflow_params
        )
        write_state(ctx.experiment, {**state, "train_run_id": run_id})
    if run_id:
        tracker.client.update_run(run_id, status="RUNNING")
    return run_id


class _Ended(NamedTuple):
    """How a Train run's fit() ended."""

    result: Any  # a ray.train.Result; None where the stopped run saved none (_saved_result)
    errored: bool = False
    interrupted: bool = False
    error: str | None = None  # the error's line, for the summary


def _fit(fit, experiment: Experiment, tracker, run_id: str | None) -> _Ended:
    """fit.fit(), and how it ended. A failed or interrupted run's result is what it saved; a
    termination signal goes on up, after the nested run is marked KILLED."""
    from ray.train import TrainingFailedError

    from rayflow.errors import first_error_line

    try:
        return _Ended(fit.fit())
    except TrainingFailedError as err:
        print(f"rayflow: Ray Train failed: {err}", file=sys.stderr, flush=True)
        return _Ended(_saved_result(experiment), errored=True, error=first_error_line(err))
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C: Ray Train's own SIGINT handler aborts the run and exits through ray.get
        # (SystemExit). Its checkpoints are saved; report what they hold. SIGTERM goes on up.
        if termination_exit_code():
            if run_id:
                tracker.write(
                    "the Train run's end", lambda client, _: client.set_terminated(run_id, "KILLED")
                )
            raise
        return _Ended(_saved_result(experiment), interrupted=True)


def train_trial(config: dict, train: TrainJob, storage: str) -> None:
    """One Tune trial: a whole Ray Train run with the trial's values in its train_loop_config;
    Train's reports go to Tune."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    trainer(
        train,
        f"train-{trial_id}",
        storage,
        [TuneReportCallback()],
        config={**train.config, **config},
    ).fit()


def sweep_job(train: TrainJob, ctx, sweep: TuneJob) -> TuneJob:
    """`sweep` (its metric, scheduler, ...) with Train runs as its trials, as many at once as the
    cluster has room for their workers (a trial only waits on its run; the workers hold the
    CPUs)."""
    import ray
    from ray import tune

    per_run = train.resources.get("CPU", 1) * train.num_workers
    free = ray.cluster_resources().get("CPU", 1) // per_run
    sweep.trainable = tune.with_parameters(
        train_trial, train=train, storage=ctx.experiment.location
    )
    sweep.resources = {"cpu": 0, "memory": 1}  # Tune wants a non-empty request; 1 byte is not a CPU
    sweep.reuse_actors = False  # a stopped trial's actor goes, and with it its Train workers
    room = max(1, int(free))
    sweep.max_concurrent_trials = min(sweep.max_concurrent_trials or room, room)
    return sweep


def run(cfg, ctx):
    from rayflow.workloads import tune as tune_kind

    train = job(cfg)
    sweep = to_container(cfg.workload.get("sweep"))
    if not sweep:
        return run_training(train, ctx, {**train.config, "num_workers": train.num_workers})
    keys = OmegaConf.create(
        {
            "workload": {
                **sweep,
                "resources_per_trial": {"cpu": 1},
                "max_failures": 0,
                "reuse_actors": False,
                "num_samples": sweep.get("num_samples", 1),
            },
            "verbose": cfg.get("verbose"),  # Tune's tables only when `verbose` asks
        }
    )
    return tune_kind.run_job(sweep_job(train, ctx, tune_kind.job(keys, train_trial)), ctx)


def figures(cfg, experiment_dir: Path) -> list:
    from rayflow.results.plots.training import reports
    from rayflow.results.records import train_epochs
    from rayflow.workloads import tune as tune_kind

    sweep = to_container(cfg.workload.get("sweep"))
    if sweep:
        keys = OmegaConf.create({"workload": sweep})
        return tune_kind.figures(keys, experiment_dir)
    return [("training.png", lambda: reports(train_epochs(experiment_dir)))]
