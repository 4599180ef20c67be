"""Backends by config name, registered once here. Imported lazily, so `--help` never loads ray or
pyspark.

Like fsspec's registry: each entry names the class that implements the backend
(rayflow.backends.base), the model of its `backend:` section (its keys, beside its code:
rayflow.schema checks them) and, where it needs an optional dependency, the extra that installs it,
so a missing package gets an install hint.

A backend outside rayflow's package is found as fsspec finds its implementations: an entry point
of the group `rayflow.backends` (in its distribution's metadata), named as its config option, whose
value names an `Entry` (`"package:ENTRY"`). They are looked for only when a name is not
rayflow's own, or when every name is asked for (`backends()`); loading one imports the module
holding its `Entry`, never its engine, and a plugin that cannot be loaded is one ConfigError naming
it. Its keys' model declares each key's default too (`plugin_defaults`): rayflow stores that as
Hydra's `backend/<name>` option before it composes (rayflow.orchestrator.compose).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
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


# The entry-point group a distribution declares its backends in (`[project.entry-points.
# "rayflow.backends"]` in its pyproject.toml): `NAME = "package.module:ENTRY"`, an Entry.
GROUP = "rayflow.backends"


def _plugins() -> dict[str, metadata.EntryPoint]:
    """The backends other distributions declare, by name, none loaded (rayflow's own names win)."""
    found = {ep.name: ep for ep in metadata.entry_points(group=GROUP)}
    return {name: ep for name, ep in found.items() if name not in REGISTRY}


def backends() -> list[str]:
    """Every backend name a config may choose: rayflow's own, then those of installed plugins."""
    return [*REGISTRY, *sorted(_plugins())]


def _plugin_entry(name: str, ep: metadata.EntryPoint) -> Entry:
    where = f"backend plugin {name!r} ({ep.value}, from {ep.dist.name if ep.dist else '?'})"
    try:
        found = ep.load()
    # a plugin's import may raise anything: it is the plugin's fault, said in one line
    except Exception as err:  # re-raised as a ConfigError
        raise ConfigError(
            "backend", f"{where} cannot be loaded: {type(err).__name__}: {err}"
        ) from err
    if isinstance(found, Entry):
        return found
    backend, keys = getattr(found, "backend", None), getattr(found, "keys", None)
    if not (isinstance(backend, str) and isinstance(keys, str)):
        raise ConfigError(
            "backend",
            f"{where} names {repr(found)[:80]}, not an Entry "
            "(rayflow.backends.Entry: backend='module:Class', keys='module:Model')",
        )
    return Entry(backend, keys, getattr(found, "extra", None), getattr(found, "stop_idle", None))


def _entry(name: str) -> Entry:
    if name in REGISTRY:
        return REGISTRY[name]
    plugin = _plugins().get(name)
    if plugin is None:
        raise ConfigError(
            "backend", f"unknown backend {name!r}; choose from {', '.join(backends())}"
        )
    return _plugin_entry(name, plugin)


def _package(name: str) -> str:
    """The distribution that provides backend `name` (an install hint's)."""
    plugin = None if name in REGISTRY else _plugins().get(name)
    return plugin.dist.name if plugin is not None and plugin.dist else "rayflow"


def _load(name: str, target: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        extra, package = _entry(name).extra, _package(name)
        hint = f"pip install '{package}[{extra}]'" if extra else f"reinstall {package}"
        raise ConfigError("backend", f"backend {name!r} needs {err.name}: {hint}") from err
    if name not in REGISTRY and not hasattr(module, attr):  # rayflow's own would be a bug
        raise ConfigError(
            "backend", f"backend plugin {name!r}: its Entry names {target}: not there"
        )
    return getattr(module, attr)


def backend_keys(name: str) -> Any:
    """The model of backend `name`'s config section (a rayflow.schema.root.Section)."""
    return _load(name, _entry(name).keys)


def plugin_defaults(name: str) -> dict[str, Any]:
    """A plugin backend's option (Hydra's `backend/<name>`): `name` and every other key of its
    keys' model at the default declared there, so each key is declared once, in the model (rayflow's
    own backends have conf/backend/<name>.yaml beside theirs). A key without a default is the
    plugin's mistake, refused naming it."""
    from pydantic import BaseModel

    if name in REGISTRY:
        raise ValueError(f"{name!r} is rayflow's own: its defaults are conf/backend/{name}.yaml")
    model = backend_keys(name)
    node: dict[str, Any] = {"name": name}
    for key, field in model.model_fields.items():
        if key == "name":
            continue
        if field.is_required():
            raise ConfigError(
                "backend",
                f"backend plugin {name!r}: its keys' model {model.__name__} declares "
                f"{key!r} without a default (every key needs one; null where it must be given)",
            )
        value = field.get_default(call_default_factory=True)
        node[key] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return node


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
    "backends",
    "plugin_defaults",
]
