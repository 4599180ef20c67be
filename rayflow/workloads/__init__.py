"""Workloads: each is one flat module that satisfies `Workload`.

Three kinds run the user's own code: `tune` (a Tune trainable), `train` (a Ray Train loop) and
`rllib` (an RLlib algorithm). The built-ins are presets of them: `cifar` is a tune workload whose
trainable is rayflow's CIFAR function, `ddp` a train workload, `ppo` an rllib one. Each preset
module maps its own keys onto its kind's public TuneJob / TrainJob / RLlib config and runs it
through the kind's code, as a user's workload does.

A workload is found by its config's `name` (the presets and the kinds themselves), else by its
`kind` (a user's own YAML under another name). Modules are imported only when chosen, so torch,
ray.tune and rllib stay out of --help.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Protocol

from rayflow.errors import ConfigError


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


class Workload(Protocol):
    """What a workload module holds (a module satisfies a Protocol by its attributes)."""

    KIND: str  # tune | train | rllib
    USES_DATA: bool  # it reads rayflow's CIFAR-format data set (the presets cifar and ddp)

    def worker_imports(self, cfg) -> tuple[str, ...]:
        """Modules every trial process imports before its first step. A backend that starts Ray's
        workers ahead of use imports them there (ClusterBackend.preload_worker_imports)."""

    def metrics(self, cfg) -> dict[str, str] | None:
        """What each trial reports, by name -> its key in a (nested) result; None: every number."""

    def params(self, cfg) -> tuple[str, ...] | None:
        """The keys of a trial's config its MLflow run records; None: all of them."""

    def check(self, cfg) -> None:
        """Preflight: raise ConfigError for bad `workload.*` keys (the user's code imports); start nothing."""

    def demand(self, cfg) -> list:
        """The resource bundles (rayflow.placement.Bundle) one trial or run needs at once."""

    def run(self, cfg, ctx) -> Summary:
        """Run on the connected cluster."""

    def figures(self, cfg, experiment_dir: Path) -> list[tuple[str, Callable[[], Any]]]:
        """(file name, a function drawing (Figure, summary)) per plot of a finished run (rayflow.plots)."""


# name -> (module, pip extra that provides its dependencies or None)
REGISTRY: dict[str, tuple[str, str | None]] = {
    "tune": ("rayflow.workloads.tune", None),
    "train": ("rayflow.workloads.train", None),
    "rllib": ("rayflow.workloads.rllib", "rllib"),
    "cifar": ("rayflow.workloads.cifar", None),
    "ddp": ("rayflow.workloads.ddp", None),
    "ppo": ("rayflow.workloads.ppo", "rllib"),
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
    raise ConfigError("workload", f"unknown workload {name!r}; choose from {', '.join(REGISTRY)} "
                                  f"(or give your own workload a kind: {', '.join(KINDS)})")


def workload_for(section: Any) -> Workload | ModuleType:
    """The module of a workload section (`cfg.workload`) or name."""
    name = registry_name(section)
    module_name, extra = REGISTRY[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        hint = f"pip install 'rayflow[{extra}]'" if extra else "reinstall rayflow"
        raise ConfigError("workload", f"workload {name!r} needs {err.name}: {hint}") from err
