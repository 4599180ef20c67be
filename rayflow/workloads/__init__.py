"""Workloads by config name: each is one flat module that satisfies `Workload`.

Modules are imported only when chosen, so torch, ray.tune and rllib stay out of --help.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Protocol

from rayflow.errors import ConfigError


class Workload(Protocol):
    """What a workload module holds (a module satisfies a Protocol by its attributes)."""

    USES_DATA: bool  # it reads the CIFAR-format data set (ppo makes its own: the environment)
    # Modules every trial process imports before its first step. A backend that starts Ray's
    # workers ahead of use imports them there (ClusterBackend.preload_worker_imports).
    WORKER_IMPORTS: tuple[str, ...]
    # What each trial reports, by name (a dict: name -> the key in a nested result, RLlib's).
    METRICS: tuple[str, ...] | dict[str, str]

    def check(self, cfg) -> None:
        """Preflight: raise ConfigError for bad `workload.*` keys; start nothing."""

    def demand(self, cfg) -> list:
        """The resource bundles (rayflow.placement.Bundle) one trial or run needs at once."""

    def run(self, cfg, ctx) -> Any:
        """Run on the connected cluster; return a summary with .table(), .parent_metrics(),
        .devices, .best_checkpoint, .interrupted, .errored and .error (the first failure's line)."""

# name -> (module, pip extra that provides its dependencies or None)
REGISTRY: dict[str, tuple[str, str | None]] = {
    "cifar": ("rayflow.workloads.cifar", None),
    "ddp": ("rayflow.workloads.ddp", None),
    "ppo": ("rayflow.workloads.ppo", "rllib"),
}


def workload_for(name: str) -> Workload | ModuleType:
    if name not in REGISTRY:
        raise ConfigError("workload", f"unknown workload {name!r}; choose from {', '.join(REGISTRY)}")
    module_name, extra = REGISTRY[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        hint = f"pip install 'rayflow[{extra}]'" if extra else "reinstall rayflow"
        raise ConfigError("workload", f"workload {name!r} needs {err.name}: {hint}") from err
