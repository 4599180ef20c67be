"""Workloads by config name. Each is one flat module with two functions:

    check(cfg)        preflight: raise ConfigError for bad `workload.*` keys, start nothing
    demand(cfg)       the resource bundles one trial or run needs at once (rayflow.placement)
    run(cfg, ctx)     run on the connected cluster, return a summary with a .table()

Modules are imported only when chosen, so torch, ray.tune and rllib stay out of --help.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from rayflow.config import ConfigError

# name -> (module, pip extra that provides its dependencies or None)
REGISTRY: dict[str, tuple[str, str | None]] = {
    "cifar": ("rayflow.workloads.cifar", None),
    "ddp": ("rayflow.workloads.ddp", None),
    "ppo": ("rayflow.workloads.ppo", "rllib"),
}


def workload_for(name: str) -> ModuleType:
    if name not in REGISTRY:
        raise ConfigError("workload", f"unknown workload {name!r}; choose from {', '.join(REGISTRY)}")
    module_name, extra = REGISTRY[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        hint = f"pip install 'rayflow[{extra}]'" if extra else "reinstall rayflow"
        raise ConfigError("workload", f"workload {name!r} needs {err.name}: {hint}") from err
