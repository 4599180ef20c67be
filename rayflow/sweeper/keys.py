"""The keys of `hydra/sweeper=rayflow` (hydra_plugins/rayflow_sweeper/rayflow.yaml): the search's
own. The backend keys beside them are the launcher's (rayflow.launcher.node), checked by the chosen
backend's model; the search's scheduler and algorithm are checked again, with Tune's own names, by
the workload=tune model they are handed to (rayflow.workloads.keys.Tune)."""

from __future__ import annotations

from pydantic import Field

from rayflow.launcher.keys import JobResources
from rayflow.schema.kinds import (
    TIME_BUDGET_MAX,
    Boolean,
    Integer,
    Mapping,
    Number,
    OneOf,
    OptionalText,
    Seconds,
    Text,
    kind,
)
from rayflow.schema.root import RayAuthModeKind, Section
from rayflow.workloads.keys import MappingOrNull, NameOrMapping


def _null(why: str):
    def check(value):
        if value is not None:
            raise ValueError(f"must be null: {why}")
        return None

    return kind("null", check)


class Sweeper(Section):
    params: Mapping = Field(
        description="what the search varies: `key: expression` in the syntax of Hydra's Optuna "
        "sweeper (`choice(a, b)`, `range(1, 5)`, `interval(0, 1)`, `tag(log, interval(1e-4, "
        "1e-1))`, `a,b,c`), or one sampler of Tune's vocabulary (`{loguniform: [1.0e-4, 0.1]}`); "
        "a plain value is the same in every trial"
    )
    n_trials: Integer() = Field(description="trials in the search")
    direction: OneOf("minimize", "maximize") = Field(description="minimize or maximize `metric`")
    metric: Text = Field(
        description="the name the task function's return value is reported under (a number), or "
        "the key of the dict it returns; what `rayflow.report` reports under it, the schedulers "
        "see before the trial ends"
    )
    search_alg: NameOrMapping = Field(
        description="`random`, `optuna`, `hyperopt`, or `{name: optuna, <Tune's parameters>}`"
    )
    scheduler: NameOrMapping = Field(
        description="`fifo`, `asha`, `hyperband`, `median_stopping`, `pbt`, `pb2`, or "
        "`{name: asha, <Tune's parameters>}`"
    )
    max_concurrent: Integer(1, optional=True) = Field(
        description="trials running at once at most (null: as many as the cluster holds)"
    )
    seed: Integer(0, optional=True) = Field(
        description="the search algorithm's seed, so a search repeats its samples (null: random)"
    )
    time_budget_s: Seconds(TIME_BUDGET_MAX, optional=True) = Field(
        description="the whole search stops after this many seconds (null: no limit)"
    )
    max_failures: Integer(0) = Field(
        description="a trial whose task raises is retried this often, then recorded as failed; "
        "the search goes on either way"
    )
    resume: Boolean = Field(
        description="continue the interrupted search kept in this sweep dir (give the same "
        "`hydra.sweep.dir`): finished trials are not repeated"
    )
    resources: JobResources = Field(description="what each trial asks Ray for")
    tracking: OneOf("mlflow", "none") = Field(
        description="`mlflow`: a parent run for the sweep and a nested run per trial; `none`"
    )
    tracking_uri: Text = Field(description="the MLflow tracking URI, as `tracking.uri`")
    experiment: OptionalText = Field(description="the MLflow experiment (null: the app's job name)")
    storage_path: OptionalText = Field(
        description="where Tune keeps the search, as rayflow's `storage_path` (null: the sweep "
        "dir; an object store, s3://BUCKET/PATH, where the trials run on separate machines)"
    )
    verbose: Integer(0, 3) = Field(description="as rayflow's own `verbose`")
    backend: OneOf("local", "attach", "spark", "vm", "kuberay") = Field(
        description="where the trials run; that backend's keys may be set beside this one (null: "
        "its default)"
    )
    ray_auth_mode: RayAuthModeKind = Field(
        description="Ray token auth for the cluster, as rayflow's own `ray_auth_mode`"
    )
    # Hydra's Optuna sweeper's keys (its users' configs run as they are)
    sampler: MappingOrNull = Field(
        description="the Optuna sweeper's sampler: `_target_` optuna.samplers.TPESampler "
        "(search_alg optuna) or RandomSampler (random), and its `seed`"
    )
    n_jobs: Integer(1, optional=True) = Field(
        description="the Optuna sweeper's batch size, here trials at once (`max_concurrent`)"
    )
    study_name: OptionalText = Field(description="the MLflow experiment (`experiment`)")
    storage: _null("the search is kept in Tune's storage (storage_path), not Optuna's database") = (
        Field(description="the Optuna sweeper's database: null here")
    )
    max_failure_rate: Number(allow_zero=True, at_most=1) = Field(
        description="the sweep fails when more than this share of its trials failed (0: any)"
    )
    custom_search_space: _null("a function that extends Optuna's trials runs under Optuna only") = (
        Field(description="the Optuna sweeper's trial extender: null here")
    )
