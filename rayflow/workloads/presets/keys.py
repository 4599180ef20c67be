"""The keys of the presets cifar, ddp and ppo (conf/workload/*.yaml) and of the CIFAR data set cifar
and ddp read (conf/workload/data/cifar10.yaml), their kinds and the rules between them.

Rules that need more than the workload's own section (a GPU request against `compute`, a sweep
against the backend's dashboard) read the whole config from the validation context."""

import math
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, ValidationInfo, model_validator

from rayflow.schema.kinds import (
    NUMBER_MAX,
    Anything,
    Boolean,
    Bytes,
    Fraction,
    Integer,
    KeyedError,
    Number,
    OneOf,
    Seconds,
    Text,
    WritableDir,
    kind,
)
from rayflow.schema.root import Section
from rayflow.workloads.keys import ModuleFunction, Shipped


def _whole(info: ValidationInfo) -> dict:
    return (info.context or {}).get("cfg", {})


def _gpu_fits_compute(gpu: float | None, key: str, info: ValidationInfo) -> None:
    """GPUs per trial or worker: null means none; more than 0 needs compute=gpu (or auto)."""
    if gpu and _whole(info).get("compute", {}).get("device") == "cpu":
        raise KeyedError(key, f"is {gpu:g} but compute=cpu; use compute=gpu")


RETURN_MAX = 1e12  # an episode return to stop at: any real one is smaller
TRIALS_MAX = 100_000  # trials of one search (each one a Tune object, a folder and an MLflow run)
WIDTH_MAX = 8192  # a hidden layer's width: fc(l1, l2) at 8192 x 8192 is 256 MB of weights
BATCH_MAX = 65_536  # samples in one batch
GRID_MAX = 1000  # values of a grid (one trial each)


def _finite(limit: float) -> Any:
    def check(value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"must be a number, got {value!r}")
        if abs(value) > limit:
            raise ValueError(f"must be between {-limit:g} and {limit:g}, got {value!r}")
        return value

    return check


def _positive_numbers_or_null(value: Any) -> list | None:
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and math.isfinite(v)
            and 0 < v <= NUMBER_MAX
            for v in value
        )
    ):
        raise ValueError(
            f"must be null or a non-empty list of numbers in (0, {NUMBER_MAX:g}]; got {value!r}"
        )
    if len(value) > GRID_MAX:
        raise ValueError(f"must hold at most {GRID_MAX} values (one trial each), got {len(value)}")
    return value


if TYPE_CHECKING:
    # mypy cannot read a kind (a call) as a type: this one lets numbers through, which compare
    AnyNumber = float
else:
    AnyNumber = kind(f"number in [{-NUMBER_MAX:g}, {NUMBER_MAX:g}]", _finite(NUMBER_MAX))
MetricKind = OneOf("val_loss", "val_accuracy")
ModeKind = OneOf("min", "max")
ModelKind = OneOf("cnn", "resnet")
LrScheduleKind = OneOf("cosine", "step", "constant")
EpisodeReturnMeanKind = kind(
    f"number in [{-RETURN_MAX:g}, {RETURN_MAX:g}]", _finite(RETURN_MAX), optional=True
)
LrGridKind = kind(
    f"null or a list of at most {GRID_MAX} numbers in (0, {NUMBER_MAX:g}]",
    _positive_numbers_or_null,
)
ActivationKind = OneOf("relu", "tanh", "swish", "linear")


class Resources(Section):
    cpu: Number() = Field(description="CPUs each one reserves")
    gpu: Number(allow_zero=True, optional=True) = Field(
        description="GPUs each one reserves (from `compute`; > 0 needs `compute=gpu` or `auto`)"
    )
    memory: Bytes(optional=True) = Field(
        description="bytes of Ray's memory resource reserved (null: none)"
    )


class Bounds(Section):
    min: AnyNumber = Field(description="lower bound")
    max: AnyNumber = Field(description="upper bound")

    @model_validator(mode="after")
    def _ordered(self) -> "Bounds":
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class LogBounds(Bounds):
    min: Number() = Field(description="lower bound (> 0: log-uniform)")
    max: Number() = Field(description="upper bound")


class Widths(Bounds):
    min: Number(at_most=WIDTH_MAX) = Field(description="lower bound")
    max: Number(at_most=WIDTH_MAX) = Field(description="upper bound")


def PositiveInts(maximum: int, most: int = 64) -> Any:
    """A non-empty list of at most `most` integers in [1, maximum] (layer sizes, batch sizes)."""

    def check(value: Any) -> list:
        if (
            not isinstance(value, list)
            or not value
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in value)
        ):
            raise ValueError(f"must be a non-empty list of positive integers; got {value}")
        if max(value) > maximum or len(value) > most:
            raise ValueError(f"must be at most {most} integers of at most {maximum}; got {value}")
        return value

    return kind(f"a non-empty list of at most {most} integers in [1, {maximum}]", check)


SYNTHETIC_MAX = 100_000  # images of 3 KB each: 300 MB, twice CIFAR-10's own training set


class Data(Section):
    # where the batches live and come from may change on resume; what the set holds may not
    resume_may_change: ClassVar[tuple[str, ...]] = ("root", "download", "url", "timeout_s")

    root: WritableDir = Field(description="CIFAR-10 python batches, shared by the trials of a node")
    download: Boolean = Field(
        description="fetch `data.url` once (checked against `data.md5`) "
        "when the batches are missing"
    )
    url: Text = Field(description="the archive's address: point at a mirror of the same file")
    md5: Text = Field(description="the archive's md5")
    synthetic: Boolean = Field(
        description="write and use a small CIFAR-format set with a learnable signal"
    )
    synthetic_train_size: Integer(10, SYNTHETIC_MAX) = Field(
        description="images in the synthetic data batches (3 KB each)"
    )
    synthetic_test_size: Integer(1, SYNTHETIC_MAX) = Field(
        description="images in the synthetic test batch"
    )
    val_fraction: Fraction = Field(
        description="share of the training batches held out for `val_loss`"
    )
    timeout_s: Seconds() = Field(
        description="the download may stall this long (each connect and read), and a trial waits "
        "this long for another's download of the same set"
    )


class CifarSpace(Section):
    l1: Widths = Field(description="powers of two in [min, max]")
    l2: Widths = Field(description="powers of two in [min, max]")
    lr: LogBounds = Field(description="log-uniform in [min, max]")
    batch_size: PositiveInts(BATCH_MAX) = Field(description="a choice")
    momentum: Number(allow_zero=True) = Field(description="SGD momentum, fixed")

    @model_validator(mode="after")
    def _a_power_of_two_in_range(self) -> "CifarSpace":
        for key in ("l1", "l2"):
            bounds = getattr(self, key)
            if not [2**i for i in range(0, 31) if bounds.min <= 2**i <= bounds.max]:
                raise KeyedError(key, f"no power of two between {bounds.min} and {bounds.max}")
        return self


class Asha(Section):
    grace_period: Integer() = Field(description="epochs every trial runs before ASHA may stop it")
    reduction_factor: Integer(2) = Field(
        description="ASHA keeps 1/reduction_factor of trials at each rung"
    )


class Cifar(Shipped):
    # the data set it reads, at the root as `data` (conf/workload/data/cifar10.yaml)
    sections: ClassVar[dict[str, type[Section]]] = {"data": Data}

    name: Text = Field(description="`cifar`: Ray Tune + ASHA over the CIFAR10 CNN")
    kind: OneOf("tune") = Field(description="a preset of `workload=tune`")
    trainable: ModuleFunction = Field(
        description="the trainable: rayflow's CIFAR function, `train_cifar(config, data, "
        "max_epochs, want_gpu)`"
    )
    num_samples: Integer(1, TRIALS_MAX) = Field(description="trials sampled from the search space")
    max_epochs: Integer() = Field(description="epochs per trial (ASHA's `max_t`)")
    metric: MetricKind = Field(description='what ASHA and "best trial" optimise')
    mode: ModeKind = Field(description="`min` or `max` of the metric")
    search_space: CifarSpace = Field(description="the search space")
    scheduler: Asha = Field(description="ASHA")
    resources_per_trial: Resources = Field(description="what each trial reserves")
    max_failures: Integer(0) = Field(description="restarts of a failed trial from its checkpoint")
    checkpoints_to_keep: Integer(1, optional=True) = Field(
        description="checkpoints kept per trial (null: all)"
    )
    reuse_actors: Boolean = Field(
        description="keep trial processes, and their loaded data, across trials"
    )

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> "Cifar":
        if self.scheduler.grace_period > self.max_epochs:
            raise KeyedError(
                "scheduler.grace_period",
                f"({self.scheduler.grace_period}) exceeds workload.max_epochs ({self.max_epochs})",
            )
        _gpu_fits_compute(self.resources_per_trial.gpu, "resources_per_trial.gpu", info)
        return self


class DdpCheckpoint(Section):
    every_epochs: Integer() = Field(description="a checkpoint every N epochs, and after the last")
    keep_best: Integer() = Field(description="keep the best K by `val_accuracy` (the latest too)")


class DdpSweep(Section):
    num_samples: Integer(1, TRIALS_MAX) = Field(
        description="trials of the sweep (`workload.tune=true`)"
    )
    lr: LogBounds = Field(description="log-uniform lr range")
    grace_period: Integer() = Field(description="epochs before ASHA may stop a trial")
    reduction_factor: Integer(2) = Field(description="ASHA's reduction factor")


class Ddp(Shipped):
    sections: ClassVar[dict[str, type[Section]]] = {"data": Data}

    name: Text = Field(description="`ddp`: data-parallel training with Ray Train")
    kind: OneOf("train") = Field(description="a preset of `workload=train`")
    train_loop: ModuleFunction = Field(
        description="the loop every worker runs: rayflow's, "
        "`rayflow.workloads.presets.ddp_loop:train_loop`"
    )
    model: ModelKind = Field(
        description="`cnn` (the seed CNN) or `resnet` (a small ResNet, ~0.7M parameters, worth a "
        "GPU)"
    )
    num_workers: Integer() = Field(description="Ray Train workers, one model replica each")
    resources_per_worker: Resources = Field(description="what each worker reserves")
    epochs: Integer() = Field(description="epochs")
    batch_size: Integer(1, BATCH_MAX) = Field(
        description="per worker: a step sees `num_workers × batch_size` samples"
    )
    lr: Number() = Field(description="peak learning rate of SGD with momentum")
    momentum: Number(allow_zero=True) = Field(description="SGD momentum")
    weight_decay: Number(allow_zero=True) = Field(description="SGD weight decay")
    lr_schedule: LrScheduleKind = Field(description="stepped every batch, after a linear warm-up")
    warmup_epochs: Integer(0) = Field(
        description="linear warm-up from 0 before the schedule (< `epochs`)"
    )
    step_epochs: Integer() = Field(description="`lr_schedule=step`: epochs between steps")
    gamma: Number() = Field(description="`lr_schedule=step`: the factor at each step")
    amp: Boolean = Field(
        description="float16 autocast and gradient scaling on GPU; CPU stays float32"
    )
    checkpoint: DdpCheckpoint = Field(description="checkpoints")
    max_failures: Integer(0) = Field(description="worker-group restarts from the latest checkpoint")
    tune: Boolean = Field(
        description="an ASHA sweep over lr; each trial a Ray Train run of `num_workers`"
    )
    sweep: DdpSweep = Field(description="the sweep (`tune=true` only)")

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> "Ddp":
        if self.warmup_epochs >= self.epochs:
            raise KeyedError("warmup_epochs", f"must be less than workload.epochs ({self.epochs})")
        _gpu_fits_compute(self.resources_per_worker.gpu, "resources_per_worker.gpu", info)
        if self.tune:
            if self.sweep.grace_period > self.epochs:
                raise KeyedError(
                    "sweep.grace_period",
                    f"({self.sweep.grace_period}) exceeds workload.epochs ({self.epochs})",
                )
            if _whole(info).get("backend", {}).get("include_dashboard") is False:
                # ASHA stops Train runs midway; Ray Train then frees their workers' placement
                # group through the state API, which the dashboard serves. Without it the sweep
                # hangs.
                raise KeyedError(
                    "!backend.include_dashboard",
                    "must be true for workload.tune=true (Ray Train frees stopped runs through the "
                    "dashboard's state API)",
                )
        return self


class PpoStop(Section):
    episode_return_mean: EpisodeReturnMeanKind = Field(
        description="stop at this mean episode return"
    )
    env_steps: Integer(1, 10**12, optional=True) = Field(
        description="stop after this many env steps"
    )
    iterations: Integer(1, 10**9, optional=True) = Field(
        description="stop after this many iterations"
    )

    @model_validator(mode="after")
    def _one_set(self) -> "PpoStop":
        if self.episode_return_mean is None and self.env_steps is None and self.iterations is None:
            raise ValueError("set at least one of episode_return_mean, env_steps, iterations")
        return self


class Ppo(Shipped):
    name: Text = Field(description="`ppo`: RLlib PPO")
    kind: OneOf("rllib") = Field(description="a preset of `workload=rllib`")
    env: Text = Field(
        description="a Gymnasium id (`module:Env-v0` imports `module` first); unknown ids are "
        "refused up front"
    )
    num_env_runners: Integer(0) = Field(
        description="sampling actors (0: sample in the algorithm's own process)"
    )
    num_envs_per_env_runner: Integer() = Field(
        description="vectorised environments each runner steps"
    )
    lr: Number() = Field(description="learning rate")
    lr_grid: LrGridKind = Field(description="a list runs one trial per value (`tune.grid_search`)")
    gamma: Number(at_most=1) = Field(description="discount")
    train_batch_size: Integer() = Field(description="env steps per training iteration")
    minibatch_size: Integer() = Field(
        description="SGD minibatch within an iteration (<= `train_batch_size`)"
    )
    num_epochs: Integer() = Field(description="passes over each train batch")
    vf_loss_coeff: Number(allow_zero=True) = Field(description="value-function loss coefficient")
    hidden: PositiveInts(WIDTH_MAX) = Field(
        description="fully connected layer sizes of the RLModule's network"
    )
    activation: ActivationKind = Field(description="the network's activation")
    vf_share_layers: Boolean = Field(
        description="policy and value function share the hidden layers"
    )
    stop: PpoStop = Field(description="a trial stops at the first it reaches (null: no limit)")
    checkpoint_every: Integer(0) = Field(
        description="iterations between checkpoints (one more at the end)"
    )
    max_failures: Integer(0) = Field(
        description="restarts of a failed trial from its last checkpoint"
    )

    @model_validator(mode="after")
    def _rules(self) -> "Ppo":
        if self.minibatch_size > self.train_batch_size:
            raise KeyedError(
                "minibatch_size",
                f"({self.minibatch_size}) exceeds workload.train_batch_size "
                f"({self.train_batch_size})",
            )
        return self


ANY = Anything  # re-used by the reference for free-form values
