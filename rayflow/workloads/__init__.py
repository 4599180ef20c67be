"""Workloads: each is one flat module that satisfies `Workload`.

Three kinds run the user's own code: `tune` (a Tune trainable), `train` (a Ray Train loop) and
`rllib` (an RLlib algorithm). The built-ins are presets of them (rayflow.workloads.presets):
`cifar` is a tune workload whose trainable is rayflow's CIFAR function, `ddp` a train workload,
`ppo` an rllib one. Each preset module maps its own keys onto its kind's public TuneJob / TrainJob /
RLlib config and runs it through the kind's code, as a user's workload does.

A workload is registered once, in REGISTRY: its module and the model of its keys (beside its code:
rayflow.workloads.keys, rayflow.workloads.presets.keys). It is found by its config's `name` (the
presets and the kinds themselves), else by its `kind` (a user's own YAML under another name).
Modules are imported only when chosen, so torch, ray.tune and rllib stay out of --help.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rayflow.errors import ConfigError
from rayflow.results.experiment import Experiment

if TYPE_CHECKING:
    from rayflow.tracking.tracker import Tracker


class Summary(Protocol):
    """What a workload's run returns (TuneSummary, TrainSummary, RLlibSummary)."""

    best_config: dict  # the best trial's config; one Train run: the config it ran with
    best_metrics: dict  # the best trial's last numbers; one Train run: its last report
    best_checkpoint: str | None
    interrupted: bool  # Ctrl-C stopped it; its state is saved for resume
    errored: int
    error: str | None  # the first failure's line
    devices: list[str]

    def parent_metrics(self) -> dict[str, float]:
        """What the parent MLflow run records about the whole run."""

    def table(self) -> str:
        """The results table printed at the end."""


@dataclass
class RunContext:
    """What a workload's run gets besides its config: where it logs and keeps its experiment."""

    tracker: Tracker  # the MLflow parent run (rayflow.tracking.tracker)
    experiment_dir: Path
    resume: bool  # the experiment goes on (resume=...): its folder holds Tune's or Train's state
    # Trials of the workload's one bundle that the cluster holds at once at its largest; None
    # when only the running cluster knows its size (attach, a job on a head, sizes left to Spark).
    trial_slots: int | None = None
    # Where Tune and Train write (rayflow.results.experiment.Experiment; by default the folder
    # `experiment_dir`), and what the trials' nodes need from this process's environment to
    # reach it (an object store's settings, where the nodes do not inherit them).
    experiment: Experiment | None = None
    node_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.experiment is None:
            self.experiment = Experiment(str(self.experiment_dir))


class Workload(Protocol):
    """What a workload module holds (a module satisfies a Protocol by its attributes)."""

    KIND: str  # tune | train | rllib

    def worker_imports(self, cfg) -> tuple[str, ...]:
        """Modules every trial process imports before its first step. A backend that starts Ray's
        workers ahead of use imports them there (rayflow.backends.WorkerPreload)."""

    def prepare(self, cfg, here: bool) -> None:
        """What the workload needs ready before its cluster starts: its data on this machine where
        `here` (the cluster's nodes share this machine's files), so a missing data set fails before
        anything starts. An extension point: the kinds, which run the user's code, need nothing."""

    def metrics(self, cfg) -> dict[str, str] | None:
        """What each trial reports, by name -> its key in a (nested) result; None: every number."""

    def params(self, cfg) -> tuple[str, ...] | None:
        """The keys of a trial's config its MLflow run records; None: all of them."""

    def check(self, cfg) -> None:
        """Preflight: raise ConfigError for bad `workload.*` keys (the user's code imports); start
        nothing."""

    def demand(self, cfg) -> list:
        """The resource bundles (rayflow.runtime.placement.Bundle) one trial or run needs at
        once."""

    def run(self, cfg, ctx) -> Summary:
        """Run on the connected cluster."""

    def figures(self, cfg, experiment_dir: Path) -> list[tuple[str, Callable[[], Any]]]:
        """(file name, a function drawing (Figure, summary)) per plot of a finished run
        (rayflow.results.plots)."""


@dataclass(frozen=True)
class Entry:
    module: str  # the module that satisfies Workload
    keys: str  # "module:Model", the schema of its config section
    extra: str | None = None  # the pip extra that provides its dependencies
    # a workload users choose (`workload=NAME`, conf/workload/NAME.yaml, the config reference);
    # False: one rayflow composes itself (hydra/sweeper=rayflow's)
    chosen: bool = True


REGISTRY: dict[str, Entry] = {
    "tune": Entry("rayflow.workloads.tune", "rayflow.workloads.keys:Tune"),
    "train": Entry("rayflow.workloads.train", "rayflow.workloads.keys:Train"),
    "rllib": Entry("rayflow.workloads.rllib", "rayflow.workloads.keys:Rllib", "rllib"),
    "cifar": Entry("rayflow.workloads.presets.cifar", "rayflow.workloads.presets.keys:Cifar"),
    "ddp": Entry("rayflow.workloads.presets.ddp", "rayflow.workloads.presets.keys:Ddp"),
    "ppo": Entry("rayflow.workloads.presets.ppo", "rayflow.workloads.presets.keys:Ppo", "rllib"),
    # hydra/sweeper=rayflow's run (rayflow.sweeper): a tune workload whose trials are Hydra jobs
    "hydra_sweep": Entry(
        "rayflow.workloads.hydra_sweep", "rayflow.workloads.keys:Tune", chosen=False
    ),
}
KINDS = ("tune", "train", "rllib")


def registry_name(section: Any) -> str:
    """The REGISTRY entry of a workload section (or a name): its name, else its kind."""
    if isinstance(section, str):
        name, kind = section, None
    else:
        name, kind = str(section.get("name")), section.get("kind")
    if name in REGISTRY:
        return name
    if kind in KINDS:
        return str(kind)
    raise ConfigError(
        "workload",
        f"unknown workload {name!r}; choose from {', '.join(REGISTRY)} "
        f"(or give your own workload a kind: {', '.join(KINDS)})",
    )


def workload_for(section: Any) -> Any:
    """The module (a Workload) of a workload section (`cfg.workload`) or name."""
    name = registry_name(section)
    entry = REGISTRY[name]
    try:
        return importlib.import_module(entry.module)
    except ImportError as err:
        hint = f"pip install 'rayflow[{entry.extra}]'" if entry.extra else "reinstall rayflow"
        raise ConfigError("workload", f"workload {name!r} needs {err.name}: {hint}") from err


def workload_keys(section: Any) -> Any:
    """The model of a workload section's keys (or a name's), a rayflow.schema.root.Section; its
    `sections` are the root sections it brings (the presets cifar and ddp: `data`)."""
    module, _, model = REGISTRY[registry_name(section)].keys.partition(":")
    return getattr(importlib.import_module(module), model)
