"""Backends by config name, registered once here. Imported lazily, so `--help` never loads ray or
pyspark.

Like fsspec's registry: each entry names the class that implements the backend
(rayflow.backends.base), the model of its `backend:` section (its keys, beside its code:
rayflow.schema checks them) and, where it needs an optional dependency, the extra that installs it,
so a missing package gets an install hint.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.base import ClusterBackend, KeepsClusters, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    backend: str  # "module:Class", a ClusterBackend
    keys: str  # "module:Model", the schema of its config section
    extra: str | None = None  # the pip extra that provides its dependencies
    # "module:function" that tears one of its clusters down from the cluster's own head, given
    # the watcher's spec (rayflow.autostop, once the cluster is idle); None: it has no watcher
    stop_idle: str | None = None


REGISTRY: dict[str, Entry] = {
    "local": Entry("rayflow.backends.local:LocalCluster", "rayflow.backends.keys:Local"),
    "attach": Entry("rayflow.backends.attach:AttachedCluster", "rayflow.backends.keys:Attach"),
    "spark": Entry(
        "rayflow.backends.spark.cluster:SparkCluster", "rayflow.backends.spark.keys:Spark", "spark"
    ),
    "vm": Entry(
        "rayflow.backends.vm.cluster:VMCluster",
        "rayflow.backends.vm.keys:Vm",
        stop_idle="rayflow.backends.vm.kept:stop_idle",
    ),
    "kuberay": Entry(
        "rayflow.backends.kuberay.cluster:KubeRayCluster",
        "rayflow.backends.kuberay.keys:Kuberay",
        "kuberay",
        stop_idle="rayflow.backends.kuberay.kept:stop_idle",
    ),
}


def _load(name: str, target: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        extra = REGISTRY[name].extra
        hint = f"pip install 'rayflow[{extra}]'" if extra else "reinstall rayflow"
        raise ConfigError("backend", f"backend {name!r} needs {err.name}: {hint}") from err
    return getattr(module, attr)


def _entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise ConfigError("backend", f"unknown backend {name!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[name]


def backend_keys(name: str) -> Any:
    """The model of backend `name`'s config section (a rayflow.schema.root.Section)."""
    return _load(name, _entry(name).keys)


def idle_stop(name: str) -> Any:
    """The function that tears a cluster of backend `name` down from its own head (its watcher's
    spec in hand), as its registry entry names it."""
    target = _entry(name).stop_idle
    if target is None:
        raise ConfigError("backend", f"backend {name!r} has no clusters that stop themselves")
    return _load(name, target)


def backend_for(cfg: DictConfig) -> ClusterBackend:
    """The backend a config chooses, built from its own section and the auth mode, nothing else of
    the run's config."""
    name = str(cfg.backend.name)
    cls = _load(name, _entry(name).backend)
    backend: ClusterBackend = cls(cfg.backend, str(cfg.ray_auth_mode))
    return backend


def backend_of(kept: KeptCluster) -> ClusterBackend:
    """The backend of a kept cluster, rebuilt from the section its run started it with (to reach
    it, or tear it down, once that run is gone)."""
    from omegaconf import OmegaConf

    cls = _load(kept.backend, _entry(kept.backend).backend)
    backend: ClusterBackend = cls(OmegaConf.create(kept.section), kept.auth_mode)
    return backend


__all__ = [
    "REGISTRY",
    "ClusterBackend",
    "ClusterHandle",
    "Entry",
    "KeepsClusters",
    "Rendered",
    "Submission",
    "Traits",
    "WorkerPreload",
    "backend_for",
    "backend_of",
    "backend_keys",
]
