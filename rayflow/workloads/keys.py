"""The keys of the workloads that run the user's own code: workload=tune, train and rllib
(conf/workload/tune.yaml, train.yaml, rllib.yaml), and what every workload ships to a remote
cluster (`working_dir`, `excludes`, `py_modules`, `pip`)."""

import math
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, model_validator

from rayflow.schema.kinds import (
    NUMBER_MAX,
    TIME_BUDGET_MAX,
    Bytes,
    Integer,
    KeyedError,
    Number,
    OneOf,
    OptionalBoolean,
    OptionalText,
    Seconds,
    Text,
    kind,
)
from rayflow.schema.root import Section
from rayflow.workloads.search_space import check_space, scheduler_spec, search_alg_spec
from rayflow.workloads.stop import check_stop


def _module_function(value: Any) -> str:
    if (
        not isinstance(value, str)
        or value.count(":") != 1
        or not all(part.strip() for part in value.split(":"))
    ):
        raise ValueError(f"must be module:function (e.g. train:objective), got {value!r}")
    return value


def _mapping_or_null(value: Any) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"must be a mapping (e.g. {{key: value}}) or null, got {value!r}")
    return value


def _texts_or_null(value: Any) -> list | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"must be a list of strings or null, got {value!r}")
    return value


def _folder_or_null(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"must be a folder path or null, got {value!r}")
    return value


def _name_or_mapping(value: Any) -> Any:
    if value is not None and not isinstance(value, (str, dict)):
        raise ValueError(f"must be a name or a mapping with `name`, got {value!r}")
    return value


def _custom_resources(value: Any) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and 0 < v <= NUMBER_MAX
        for k, v in value.items()
    ):
        raise ValueError(
            f"must be a mapping of Ray resource names to amounts in (0, {NUMBER_MAX:g}], or null; "
            f"got {value!r}"
        )
    if {"CPU", "GPU", "memory"} & set(value):
        raise ValueError("CPU, GPU and memory have keys of their own (cpu, gpu, memory)")
    return value


ModuleFunction = kind("module:function", _module_function)
MappingOrNull = kind("a mapping, or null", _mapping_or_null)
TextsOrNull = kind("a list of strings, or null", _texts_or_null)
FolderOrNull = kind("a folder path, or null", _folder_or_null)
NameOrMapping = kind("a name or a mapping with `name` and parameters, or null", _name_or_mapping)
CustomResources = kind("a mapping of Ray resource names to amounts, or null", _custom_resources)
ModeKind = OneOf("min", "max")


def free_form_keys(model: type[Section]) -> set[str]:
    """The model's keys whose value is a mapping of the user's own keys (kind: a mapping, or
    null)."""
    return {
        name
        for name, field in model.model_fields.items()
        if any(getattr(meta, "words", None) == "a mapping, or null" for meta in field.metadata)
    }


class Shipped(Section):
    """What a job on a remote cluster (vm, kuberay) takes with it besides rayflow
    (rayflow.orchestrator.job_files)."""

    # where the job's files come from may change on resume; every other workload key is the
    # trials' own
    resume_may_change: ClassVar[tuple[str, ...]] = ("working_dir", "excludes", "py_modules", "pip")

    working_dir: FolderOrNull = Field(
        description="vm, kuberay: the folder shipped as the Ray Job's `working_dir` "
        "(`.`: where you run rayflow; null: nothing)"
    )
    excludes: TextsOrNull = Field(
        description="more gitignore-style patterns left out of `working_dir` "
        "(`.git`, virtual environments, `mlruns/`, `outputs/` always are)"
    )
    py_modules: TextsOrNull = Field(
        description="installed packages or modules shipped with the job, by import name"
    )
    pip: TextsOrNull = Field(
        description="requirements the job installs on the cluster (runtime_env `pip`)"
    )


class UserResources(Section):
    cpu: Number() = Field(description="CPUs each one reserves")
    gpu: Number(allow_zero=True, optional=True) = Field(
        description="GPUs each one reserves (> 0 needs `compute=gpu` or `auto`)"
    )
    memory: Bytes(optional=True) = Field(
        description="bytes of Ray's memory resource reserved (null: none)"
    )
    custom: CustomResources = Field(
        description="custom Ray resources each one reserves, e.g. `{accelerator_x: 1}`"
    )


class Checkpointing(Section):
    num_to_keep: Integer(1, optional=True) = Field(description="checkpoints kept (null: all)")
    score_attribute: OptionalText = Field(
        description="keep the best `num_to_keep` by this reported key (null: the latest)"
    )
    score_order: ModeKind = Field(description="`max` or `min` of `score_attribute`")


def under(key: str, check, *args) -> Any:
    """`check(*args)`, its KeyedError named from the workload's `key` down (search_space.lr)."""
    try:
        return check(*args)
    except KeyedError as err:
        raise KeyedError(f"{key}.{err.key}" if err.key else key, str(err)) from None


def _gpu_fits_compute(gpu: float | None, key: str, info: ValidationInfo) -> None:
    if gpu and (info.context or {}).get("cfg", {}).get("compute", {}).get("device") == "cpu":
        raise KeyedError(key, f"is {gpu:g} but compute=cpu; use compute=gpu")


class Tune(Shipped):
    name: Text = Field(description="the workload's name (`tune`, or your own YAML's)")
    kind: OneOf("tune") = Field(description="`tune`: a Ray Tune trainable of yours")
    trainable: ModuleFunction = Field(
        description="`module:function` (or a Tune Trainable class), importable from where you "
        "run rayflow or installed; `rayflow.run(trainable=fn)` takes the function itself"
    )
    search_space: MappingOrNull = Field(
        description="the trial configs to sample, in the vocabulary (docs/workloads/tune.md): "
        "`{lr: {loguniform: [1e-4, 1e-1]}, width: {choice: [64, 128]}}`"
    )
    config: MappingOrNull = Field(
        description="fixed values every trial's config gets (`search_space` wins on a clash)"
    )
    metric: Text = Field(
        description='the reported key the scheduler, the search algorithm and "best trial" optimise'
    )
    mode: ModeKind = Field(description="`min` or `max` of the metric")
    num_samples: Integer(1, 100_000) = Field(
        description="trials sampled from `search_space` (each `grid_search` point this often)"
    )
    scheduler: NameOrMapping = Field(
        description="null (fifo), `asha`, `hyperband`, `median_stopping`, `pbt`, `pb2`, or "
        "`{name: asha, <Tune's parameters>}`"
    )
    search_alg: NameOrMapping = Field(
        description="null (random), `optuna`, `hyperopt`, or `{name: optuna, max_concurrent: 4, "
        "<parameters>}`"
    )
    max_concurrent_trials: Integer(1, optional=True) = Field(
        description="at most this many trials at once (null: as many as fit)"
    )
    stop: MappingOrNull = Field(
        description="Tune's stop mapping, e.g. `{training_iteration: 20}`: a trial stops at the "
        "first key it reaches. Keys: Tune's counters (`training_iteration`, `time_total_s`, ...), "
        "`done`, the metric, or one listed in `reports`; values: numbers (`done`: true or false)"
    )
    reports: TextsOrNull = Field(
        description="keys the trainable reports besides the metric, that `stop` may name "
        "(e.g. `[accuracy]`); a stop on a key no trial reports is refused before anything starts"
    )
    time_budget_s: Seconds(TIME_BUDGET_MAX, optional=True) = Field(
        description="the whole search stops after this many seconds"
    )
    resources_per_trial: UserResources = Field(description="what each trial reserves")
    max_failures: Integer(0) = Field(
        description="restarts of a failed trial from its last checkpoint"
    )
    checkpoint: Checkpointing = Field(description="which checkpoints each trial keeps")
    reuse_actors: OptionalBoolean = Field(
        description="keep trial processes across trials; null: where it is safe (a function "
        "trainable, or a Trainable class that overrides `reset_config`; any other class gets a "
        "new process per trial, as Tune's default); true with such a class is refused"
    )

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> "Tune":
        under("search_space", check_space, self.search_space)
        scheduler, _ = under("scheduler", scheduler_spec, self.scheduler)
        if scheduler in ("pbt", "pb2") and self.checkpoint.num_to_keep is not None:
            # a trial exploiting another copies that trial's checkpoint, which the other may have
            # deleted meanwhile ("does not exist on storage anymore")
            raise KeyedError(
                "checkpoint.num_to_keep",
                f"must be null with scheduler {scheduler}: its trials restore "
                "from each other's checkpoints, which a kept number would delete",
            )
        under("search_alg", search_alg_spec, self.search_alg)
        check_stop(self.stop, [self.metric, *(self.reports or [])], declare="workload.reports")
        _gpu_fits_compute(self.resources_per_trial.gpu, "resources_per_trial.gpu", info)
        return self


class Train(Shipped):
    name: Text = Field(description="the workload's name (`train`, or your own YAML's)")
    kind: OneOf("train") = Field(description="`train`: a Ray Train loop of yours")
    train_loop: ModuleFunction = Field(
        description="`module:function`: Ray Train's `train_loop_per_worker(config)`; "
        "`rayflow.run(train_loop=fn)` takes the function itself"
    )
    train_loop_config: MappingOrNull = Field(description="the dict every worker's loop gets")
    num_workers: Integer() = Field(description="Ray Train workers, one process each")
    resources_per_worker: UserResources = Field(description="what each worker reserves")
    max_failures: Integer(0) = Field(
        description="restarts of the worker group from its latest checkpoint"
    )
    checkpoint: Checkpointing = Field(description="which checkpoints the run keeps")
    sweep: MappingOrNull = Field(
        description="a Tune search over `train_loop_config`, each trial a whole Train run: "
        "`{search_space: ..., num_samples: 4, metric: loss, mode: min, scheduler: asha}`"
    )

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> "Train":
        _gpu_fits_compute(self.resources_per_worker.gpu, "resources_per_worker.gpu", info)
        if self.sweep is None:
            return self
        known = {
            "search_space",
            "num_samples",
            "metric",
            "mode",
            "scheduler",
            "search_alg",
            "max_concurrent_trials",
            "stop",
            "time_budget_s",
        }
        unknown = sorted(set(self.sweep) - known)
        if unknown:
            raise KeyedError(
                f"sweep.{unknown[0]}", f"is not a sweep key; sweep takes {', '.join(sorted(known))}"
            )
        for key in ("metric", "mode"):
            if not self.sweep.get(key):
                raise KeyedError(
                    f"sweep.{key}",
                    "is missing: a sweep optimises a reported key (metric: loss, mode: min)",
                )
        if self.sweep["mode"] not in ("min", "max"):
            raise KeyedError("sweep.mode", f"must be one of min, max; got {self.sweep['mode']!r}")
        under("sweep", check_stop, self.sweep.get("stop"), (), None)
        under("sweep.search_space", check_space, self.sweep.get("search_space"))
        under("sweep.scheduler", scheduler_spec, self.sweep.get("scheduler"))
        under("sweep.search_alg", search_alg_spec, self.sweep.get("search_alg"))
        return self


class Rllib(Shipped):
    name: Text = Field(description="the workload's name (`rllib`, or your own YAML's)")
    kind: OneOf("rllib") = Field(description="`rllib`: an RLlib algorithm")
    algorithm: Text = Field(
        description="a name in RLlib's registry: PPO, DQN, SAC, APPO, IMPALA, ... (unknown names "
        "are refused up front)"
    )
    env: Text = Field(
        description="a Gymnasium id (`package.module:EnvId-v0` imports the module first), or "
        "`module:Class` of yours"
    )
    config: MappingOrNull = Field(
        description="sections of the algorithm's config, each applied as "
        "`config.<section>(**values)`: `{training: {lr: 5e-4}, env_runners: {num_env_runners: 1}}`"
    )
    grid: MappingOrNull = Field(
        description="one trial per value of a key of the algorithm's config: `{lr: [1e-4, 5e-4]}`"
    )
    stop: MappingOrNull = Field(
        description="Tune's stop mapping over the algorithm's results, e.g. "
        "`{env_runners/episode_return_mean: 450, num_env_steps_sampled_lifetime: 100000}`"
    )
    checkpoint_every: Integer(0) = Field(
        description="iterations between checkpoints (one more at the end)"
    )
    max_failures: Integer(0) = Field(
        description="restarts of a failed trial from its last checkpoint"
    )

    @model_validator(mode="after")
    def _rules(self) -> "Rllib":
        # RLlib's results are nested (`env_runners/episode_return_mean`) and differ by algorithm:
        # their names are Tune's to find; the values must still be numbers it can stop at
        check_stop(self.stop, (), declare=None)
        return self
