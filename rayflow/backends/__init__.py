"""Backends by config name. Imported lazily, so `--help` never loads ray or pyspark.

Like fsspec's registry: each entry names its module and, where it needs an optional
dependency, the extra that installs it, so a missing package gets an install hint.
"""

from __future__ import annotations

import importlib

from omegaconf import DictConfig

from rayflow.backends.base import ClusterBackend
from rayflow.errors import ConfigError

# name -> (module, class, pip extra that provides its dependencies or None)
REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "local": ("rayflow.backends.local", "LocalCluster", None),
    "attach": ("rayflow.backends.attach", "AttachedCluster", None),
    "spark": ("rayflow.backends.spark.cluster", "SparkCluster", "spark"),
    "vm": ("rayflow.backends.vm.cluster", "VMCluster", None),
    "kuberay": ("rayflow.backends.kuberay.cluster", "KubeRayCluster", "kuberay"),
}


def backend_for(cfg: DictConfig) -> ClusterBackend:
    name = cfg.backend.name
    if name not in REGISTRY:
        raise ConfigError("backend", f"unknown backend {name!r}; choose from {', '.join(REGISTRY)}")
    module_name, class_name, extra = REGISTRY[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = f"pip install 'rayflow[{extra}]'" if extra else "reinstall rayflow"
        raise ConfigError("backend", f"backend {name!r} needs {err.name}: {hint}") from err
    # A backend gets its own section and the auth mode, nothing else of the run's config.
    return getattr(module, class_name)(cfg.backend, str(cfg.ray_auth_mode))


__all__ = ["ClusterBackend", "REGISTRY", "backend_for"]
