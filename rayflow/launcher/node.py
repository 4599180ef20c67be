"""The config node of `hydra/launcher=rayflow`, built when Hydra discovers the plugin (YAML only:
no ray, no pydantic). It is the launcher's own keys (hydra_plugins/rayflow_launcher/rayflow.yaml)
and every key of every backend (conf/backend/*.yaml) set to null, which means "that backend's
default": so `hydra.launcher.backend=spark hydra.launcher.max_worker_nodes=4` composes as the
same keys do under rayflow's own `backend=spark backend.max_worker_nodes=4`."""

from __future__ import annotations

import copy
import functools
from importlib import resources

import yaml

# Backend keys the launcher sets itself: `name` is `backend`; the device follows the jobs' GPUs.
DERIVED = ("name", "compute_device")


@functools.cache
def _own() -> dict:
    return yaml.safe_load(
        (resources.files("hydra_plugins.rayflow_launcher") / "rayflow.yaml").read_text()
    )


def own_keys() -> dict:
    """The launcher's own keys and defaults, as its YAML says (a copy of what was read once)."""
    return copy.deepcopy(_own())


def backend_defaults(name: str) -> dict:
    """A backend's keys and defaults as rayflow's own runs compose them (conf/backend/NAME.yaml)."""
    return (
        yaml.safe_load((resources.files("rayflow.conf") / "backend" / f"{name}.yaml").read_text())
        or {}
    )


@functools.cache
def backend_keys() -> dict[str, tuple[str, ...]]:
    """Every backend key the launcher takes -> the backends that have it."""
    # rayflow's own backends only, not plugins (rayflow.backends.backends()): this node is built
    # when Hydra discovers the launcher, in every Hydra app, used or not, from YAML alone; a
    # plugin's keys are in its model (pydantic, its package imported, perhaps broken). Its
    # `backend` choice is the same list (rayflow.launcher.keys.Launcher).
    from rayflow.backends import REGISTRY  # no engine is imported

    found: dict[str, list[str]] = {}
    for name in REGISTRY:
        for key in backend_defaults(name):
            if key not in DERIVED:
                found.setdefault(key, []).append(name)
    return {key: tuple(names) for key, names in found.items()}


def launcher_node() -> dict:
    """What ConfigStore holds as hydra/launcher=rayflow."""
    node, backend = own_keys(), backend_keys()
    assert not set(node) & set(backend), (
        f"launcher keys shadow backend keys: {set(node) & set(backend)}"
    )
    return {**node, **dict.fromkeys(backend)}
