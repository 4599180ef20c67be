"""workload=tune: the user's own Ray Tune trainable, its search space, scheduler and search
algorithm from YAML.

    python -m rayflow workload=tune workload.trainable=train:objective workload.metric=loss \
        workload.mode=min 'workload.search_space={lr: {loguniform: [1e-4, 1e-1]}}'

`job(cfg, trainable)` turns the keys into a TuneJob (rayflow.workloads.tune_runner), the one seam
every tuning workload goes through: workload=cifar is this workload with rayflow's CIFAR trainable
and keys of its own (rayflow.workloads.presets.cifar), and scripts/bench.py times a user trainable
through it.
"""

from __future__ import annotations

from pathlib import Path

from rayflow.errors import ConfigError
from rayflow.results.records import trial_restarts
from rayflow.runtime.placement import Bundle, section_bundle
from rayflow.runtime.verbosity import tune_verbose
from rayflow.schema.values import to_container
from rayflow.workloads import user_code
from rayflow.workloads.tune_runner import TuneJob, run_tune
from rayflow.workloads.tune_summary import TuneSummary, summarize

KIND = "tune"


def trainable(cfg):
    return user_code.load(cfg.workload.trainable, "workload.trainable")


TUNE_WRAPPER = "ray.tune.trainable.function_trainable"


def prepare(cfg, here: bool) -> None:
    """Nothing: the trainable brings its own data."""


def worker_imports(cfg) -> tuple[str, ...]:
    """Tune's function-trainable wrapper (about a second of imports in a fresh process) and the
    trainable's module with what it imports, loaded by workers started ahead of use; not the
    module of a function defined in a notebook (it travels pickled by value)."""
    module = user_code.module_of(str(cfg.workload.trainable))
    own = module == "__main__" or user_code.is_given(str(cfg.workload.trainable))
    return (TUNE_WRAPPER, *(() if own else (module,)))


def metrics(cfg) -> None:
    return None  # every number the trainable reports


def params(cfg) -> None:
    return None  # the trial's whole config


def check(cfg) -> None:
    """What the schema cannot know: the trainable imports and is callable, and Tune builds the
    scheduler and search algorithm from their keys."""
    from rayflow.workloads.tune_search import check_tune_parts

    reuse_actors(trainable(cfg), cfg.workload.get("reuse_actors"))
    check_tune_parts(to_container(cfg.workload))


def reuse_actors(fn, asked) -> bool:
    """Whether trials reuse their actors: as asked, or where it is safe when `asked` is null. A
    reused actor gets the next trial's config through `reset_config`; a Trainable class that does
    not override it (Tune's returns False) fails every trial that reuses it, so such a class runs
    with a new actor per trial, as Tune's own default. Function trainables always can."""
    from ray.tune import Trainable

    resets = not (isinstance(fn, type) and issubclass(fn, Trainable)) or (
        getattr(fn, "reset_config", None) is not Trainable.reset_config
    )
    if asked is True and not resets:
        raise ConfigError(
            "workload.reuse_actors",
            f"is true but {fn.__name__} does not override reset_config, which a reused actor "
            "calls for each new trial; leave it null (reuse where safe) or implement reset_config",
        )
    return resets if asked is None else bool(asked)


def demand(cfg) -> list[Bundle]:
    bundle = section_bundle(cfg, "a trial", "workload.resources_per_trial")
    custom = to_container(cfg.workload.resources_per_trial.get("custom")) or {}
    if not custom:
        return [bundle]
    keys = {**bundle.keys, **{r: f"workload.resources_per_trial.custom.{r}" for r in custom}}
    return [
        Bundle(bundle.what, {**bundle.resources, **{r: float(v) for r, v in custom.items()}}, keys)
    ]


def resources(section) -> dict:
    """Tune's resource request of a `resources_per_trial` section."""
    amounts = {"cpu": float(section.cpu), "gpu": float(section.get("gpu") or 0)}
    if section.get("memory"):
        amounts["memory"] = int(section.memory)
    custom = to_container(section.get("custom")) or {}
    return {
        **amounts,
        **({"custom_resources": {k: float(v) for k, v in custom.items()}} if custom else {}),
    }


# How the table names a scheduler that stops trials before their limit (None: it never does).
SCHEDULER_LABELS = {
    "asha": "ASHA",
    "hyperband": "HyperBand",
    "median_stopping": "the median stopping rule",
}


def progress(scheduler_value, stop: dict | None) -> tuple[str, str, int | None, list[int]]:
    """(scheduler name, time_attr, max_t, ASHA's rungs): what counts a trial's progress and how far
    it may go (the plots' x axis, the table's budget), from the scheduler's keys and Tune's
    defaults for those not given, capped by the stop mapping's limit on the same attribute."""
    import inspect

    from rayflow.workloads.search_space import scheduler_spec
    from rayflow.workloads.tune_search import scheduler_class

    name, given = scheduler_spec(scheduler_value)
    cls = scheduler_class(name)
    defaults = (
        {}
        if cls is None
        else {
            k: p.default
            for k, p in inspect.signature(cls).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
    )
    settings = {**defaults, **given}
    # make_scheduler's default, not the class's
    time_attr = str(given.get("time_attr") or "training_iteration")
    # Tune's default is no limit a trainable knows of
    max_t = given.get("max_t") if name in SCHEDULER_LABELS else None
    limit = (stop or {}).get(time_attr)
    if isinstance(limit, (int, float)) and not isinstance(limit, bool):
        max_t = min(max_t, limit) if max_t else limit
    rungs = []
    if name == "asha":
        from rayflow.results.plots.curves import asha_rungs

        rungs = asha_rungs(
            int(settings.get("grace_period", 1)),
            int(settings.get("reduction_factor", 4)),
            int(max_t or settings.get("max_t") or 0),
        )
    return name, time_attr, int(max_t) if max_t else None, rungs


def job(cfg, fn, callbacks=()) -> TuneJob:
    """The TuneJob the `workload=tune` keys describe, for the trainable `fn`."""
    from rayflow.workloads.tune_search import make_scheduler, make_search_alg, to_tune

    w = cfg.workload
    space = {
        **(to_container(w.get("config")) or {}),
        **to_tune(to_container(w.get("search_space")) or {}),
    }
    metric, mode = str(w.metric), str(w.mode)
    stop = to_container(w.get("stop")) or None
    name, time_attr, max_t, _ = progress(to_container(w.get("scheduler")), stop)
    checkpoint = w.get("checkpoint") or {}
    return TuneJob(
        trainable=fn,
        param_space=space,
        metric=metric,
        mode=mode,
        num_samples=int(w.num_samples),
        resources=resources(w.resources_per_trial),
        scheduler=make_scheduler(to_container(w.get("scheduler")), metric, mode),
        search_alg=make_search_alg(
            to_container(w.get("search_alg")),
            metric,
            mode,
            to_container(w.get("search_space")) or {},
        ),
        max_failures=int(w.max_failures),
        checkpoints_to_keep=checkpoint.get("num_to_keep"),
        checkpoint_score_attribute=checkpoint.get("score_attribute"),
        checkpoint_score_order=str(checkpoint.get("score_order") or "max"),
        reuse_actors=reuse_actors(fn, w.get("reuse_actors")),
        max_concurrent_trials=w.get("max_concurrent_trials"),
        stop=stop,
        time_budget_s=w.get("time_budget_s"),
        callbacks=list(callbacks),
        time_attr=time_attr,
        max_t=max_t,
        scheduler_label=SCHEDULER_LABELS.get(name),
        shown_metrics=(metric,),
        verbose=tune_verbose(cfg.get("verbose")),
    )


def run_job(tuned: TuneJob, ctx, metrics=None, params=None) -> TuneSummary:
    """Run a TuneJob in the run's experiment folder, each trial mirrored into a nested MLflow run
    (`metrics`: name -> result key; None: every number the trial reports), and summarise it."""
    callback = ctx.tracker.trial_callback(metrics, tuned.max_t, params, time_attr=tuned.time_attr)
    if tuned.max_pending_trials is None:
        tuned.max_pending_trials = ctx.trial_slots
    tuned.callbacks = [*tuned.callbacks, *([callback] if callback else [])]
    results, interrupted = run_tune(tuned, ctx.experiment, resume=ctx.resume, env=ctx.node_env)
    return summarize(results, tuned, interrupted, trial_restarts(ctx.experiment_dir))


def run(cfg, ctx) -> TuneSummary:
    return run_job(job(cfg, trainable(cfg)), ctx)


def figures(cfg, experiment_dir: Path, keys: tuple[str, ...] | None = None) -> list:
    """Learning curves of the chosen metric over the scheduler's time attribute, and the search
    view (of the config's `keys`; None: every key that varies)."""
    from rayflow.results.plots.make import tune_figures

    w = cfg.workload
    name, time_attr, max_t, rungs = progress(
        to_container(w.get("scheduler")), to_container(w.get("stop")) or None
    )
    return tune_figures(
        experiment_dir,
        str(w.metric),
        str(w.mode),
        time_attr,
        max_t,
        rungs,
        SCHEDULER_LABELS.get(name),
        keys,
    )
