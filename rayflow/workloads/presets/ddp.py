"""workload=ddp: data-parallel training of rayflow's CIFAR CNN (or a small ResNet) with Ray
Train — a preset of workload=train whose loop is rayflow.workloads.presets.ddp_loop.train_loop.

Its keys map onto workload=train's TrainJob (`job`) and run through that workload's
`run_training`, or, with `tune=true`, its `sweep_job`: an ASHA search over lr whose every trial
is a Ray Train run of num_workers.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from rayflow.results.records import SWEEP_METRIC, SWEEP_MODE
from rayflow.runtime.placement import Bundle, section_bundle
from rayflow.workloads.presets import cifar_data
from rayflow.workloads.presets.ddp_loop import METRICS, loop_config
from rayflow.workloads.train_runner import TrainJob

KIND = "train"


def prepare(cfg, here: bool) -> None:
    """The CIFAR-format data set (conf/workload/data/cifar10.yaml), made or fetched here before the
    cluster starts."""
    cifar_data.prepare_run(cfg, here)


def worker_imports(cfg) -> tuple[str, ...]:
    # none preloaded: every new worker would import them, Ray Train's controller (no torch) too
    return ()


def metrics(cfg) -> dict[str, str]:
    return {m: m for m in METRICS}


def params(cfg) -> None:
    return None


def figures(cfg, experiment_dir):
    from rayflow.results.plots.curves import asha_rungs
    from rayflow.results.plots.make import tune_figures
    from rayflow.results.plots.training import training
    from rayflow.results.records import train_epochs

    w = cfg.workload
    if w.tune:
        rungs = asha_rungs(int(w.sweep.grace_period), int(w.sweep.reduction_factor), int(w.epochs))
        return tune_figures(
            experiment_dir, SWEEP_METRIC, SWEEP_MODE, "epoch", int(w.epochs), rungs, "ASHA"
        )
    return [("training.png", lambda: training(train_epochs(experiment_dir)))]


SCHEDULES = ("cosine", "step", "constant")


def check(cfg) -> None:
    """Every key of workload=ddp is checked by its schema (rayflow.workloads.presets.keys.Ddp)."""


def demand(cfg) -> list[Bundle]:
    """One Train run: num_workers workers at once (the controller and a sweep's trial take no
    CPU)."""
    return [
        section_bundle(
            cfg,
            "a Train worker",
            "workload.resources_per_worker",
            count=int(cfg.workload.num_workers),
            count_key="workload.num_workers",
        )
    ]


def job(cfg, ctx) -> TrainJob:
    """workload=ddp's keys as the TrainJob workload=train runs."""
    from rayflow.workloads import user_code
    from rayflow.workloads.train import worker_resources

    w = cfg.workload
    return TrainJob(
        train_loop=user_code.load(w.train_loop, "workload.train_loop"),
        config=loop_config(cfg, cifar_data.spec(cfg)),
        num_workers=int(w.num_workers),
        resources=worker_resources(w.resources_per_worker),
        max_failures=int(w.max_failures),
        num_to_keep=int(w.checkpoint.keep_best),
        score_attribute="val_accuracy",
        score_order="max",
        epochs=int(w.epochs),
    )


def sweep(cfg, ctx, train: TrainJob):
    """ASHA over the learning rate, in workload=tune's vocabulary."""
    from rayflow.workloads import tune as tune_kind
    from rayflow.workloads.train import sweep_job, train_trial

    w = cfg.workload
    keys = OmegaConf.create(
        {
            "workload": {
                "search_space": {
                    "lr": {"loguniform": [float(w.sweep.lr.min), float(w.sweep.lr.max)]}
                },
                "metric": SWEEP_METRIC,
                "mode": SWEEP_MODE,
                "num_samples": int(w.sweep.num_samples),
                "scheduler": scheduler_keys(w),
                "resources_per_trial": {"cpu": 1},
                "max_failures": 0,
                "reuse_actors": False,
            },
            "verbose": cfg.get("verbose"),  # Tune's tables only when `verbose` asks
        }
    )
    searched = tune_kind.job(keys, train_trial)
    searched.shown_metrics = ("val_accuracy", "val_loss")
    return sweep_job(train, ctx, searched)


def scheduler_keys(w) -> dict:
    return {
        "name": "asha",
        "time_attr": "epoch",
        "max_t": int(w.epochs),
        "grace_period": int(w.sweep.grace_period),
        "reduction_factor": int(w.sweep.reduction_factor),
    }


def run(cfg, ctx):
    from rayflow.workloads import train as train_kind
    from rayflow.workloads.tune import run_job

    ctx.tracker.set_tags(cifar_data.tags(cfg))
    train = job(cfg, ctx)
    if not cfg.workload.tune:
        params = {k: v for k, v in train.config.items() if k not in ("data", "mlflow")}
        params |= {
            "num_workers": train.num_workers,
            "cpu": train.resources.get("CPU"),
            "gpu": train.resources.get("GPU", 0),
            "max_failures": train.max_failures,
            "keep_best": train.num_to_keep,
        }
        summary = train_kind.run_training(train, ctx, params)
        summary.best_config = {k: v for k, v in cfg.workload.items() if not OmegaConf.is_config(v)}
        return summary
    return run_job(sweep(cfg, ctx, train), ctx, metrics(cfg))
