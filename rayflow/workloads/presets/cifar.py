"""workload=cifar: Ray Tune + ASHA over the seed tutorial's CIFAR10 CNN, a checkpoint per epoch.

This module is the driver's side: the preset's keys as the TuneJob workload=tune runs, the data
set made before the cluster starts, the plots, and the trainable `conf/workload/cifar.yaml`
names, which runs the trial's code (rayflow.workloads.presets.cifar_train) in the trial's
process: only trials import it, and torch with it. A run's driver, a dry run and a refusal never
import torch (about a second of start-up).
"""

from __future__ import annotations

from rayflow.runtime.placement import Bundle, section_bundle
from rayflow.workloads.presets import cifar_data
from rayflow.workloads.presets.cifar_data import DataSpec

# a preset of workload=tune: conf/workload/cifar.yaml names train_cifar as its trainable
KIND = "tune"
METRICS = ("val_loss", "val_accuracy", "train_loss", "epoch")


def prepare(cfg, here: bool) -> None:
    """The CIFAR-format data set (conf/workload/data/cifar10.yaml), made or fetched here before the
    cluster starts."""
    cifar_data.prepare_run(cfg, here)


def worker_imports(cfg) -> tuple[str, ...]:
    # none preloaded (rayflow.workloads.Workload): a trial imports torch in about a second
    return ()


def metrics(cfg) -> dict[str, str]:
    return {m: m for m in METRICS}


def params(cfg) -> None:
    return None


def powers_of_two(low: int, high: int) -> list[int]:
    return [2**i for i in range(0, 31) if low <= 2**i <= high]


def check(cfg) -> None:
    """Every key of workload=cifar is checked by its schema
    (rayflow.workloads.presets.keys.Cifar)."""


def demand(cfg) -> list[Bundle]:
    return [section_bundle(cfg, "a trial", "workload.resources_per_trial")]


def search_space(w) -> dict:
    from ray import tune

    s = w.search_space
    return {
        "l1": tune.choice(powers_of_two(s.l1.min, s.l1.max)),
        "l2": tune.choice(powers_of_two(s.l2.min, s.l2.max)),
        "lr": tune.loguniform(s.lr.min, s.lr.max),
        "batch_size": tune.choice(list(s.batch_size)),
        "momentum": float(s.momentum),
    }


def train_cifar(config: dict, data: DataSpec, max_epochs: int, want_gpu: bool) -> None:
    """The trainable: one trial, one process (rayflow.workloads.presets.cifar_train.train)."""
    from rayflow.workloads.presets.cifar_train import train

    train(config, data, max_epochs, want_gpu)


def scheduler_keys(w) -> dict:
    """ASHA over epochs, in workload=tune's scheduler vocabulary."""
    return {
        "name": "asha",
        "time_attr": "epoch",
        "max_t": int(w.max_epochs),
        "grace_period": int(w.scheduler.grace_period),
        "reduction_factor": int(w.scheduler.reduction_factor),
    }


def job(cfg, ctx):
    """workload=cifar's keys as the TuneJob workload=tune runs (rayflow.workloads.tune)."""
    from ray import tune

    from rayflow.runtime.verbosity import tune_verbose
    from rayflow.workloads import user_code
    from rayflow.workloads.tune import resources
    from rayflow.workloads.tune_runner import TuneJob
    from rayflow.workloads.tune_search import make_scheduler

    w = cfg.workload
    gpus = float(w.resources_per_trial.gpu or 0)
    fn = user_code.load(w.trainable, "workload.trainable")
    return TuneJob(
        trainable=tune.with_parameters(
            fn, data=cifar_data.spec(cfg), max_epochs=int(w.max_epochs), want_gpu=gpus > 0
        ),
        param_space=search_space(w),
        metric=str(w.metric),
        mode=str(w.mode),
        num_samples=int(w.num_samples),
        resources=resources(w.resources_per_trial),
        scheduler=make_scheduler(scheduler_keys(w), str(w.metric), str(w.mode)),
        max_failures=int(w.max_failures),
        checkpoints_to_keep=w.checkpoints_to_keep,
        reuse_actors=bool(w.reuse_actors),
        time_attr="epoch",
        max_t=int(w.max_epochs),
        scheduler_label="ASHA",
        shown_metrics=("val_accuracy", "val_loss"),
        verbose=tune_verbose(cfg.get("verbose")),  # Tune's tables only when `verbose` asks
    )


def run(cfg, ctx):
    """Tune the CNN with ASHA on the connected cluster; returns a TuneSummary."""
    from rayflow.workloads.tune import run_job

    ctx.tracker.set_tags(cifar_data.tags(cfg))
    return run_job(job(cfg, ctx), ctx, metrics(cfg))


def figures(cfg, experiment_dir):
    from rayflow.results.plots.make import tune_figures
    from rayflow.workloads.tune import progress

    w = cfg.workload
    _, time_attr, max_t, rungs = progress(scheduler_keys(w), None)
    return tune_figures(experiment_dir, str(w.metric), str(w.mode), time_attr, max_t, rungs, "ASHA")
