"""The config node of `hydra/sweeper=rayflow`, built when Hydra discovers the plugin (YAML only:
no ray, no pydantic): its own keys (hydra_plugins/rayflow_sweeper/rayflow.yaml) and every backend's
key set to null, as the launcher's node (rayflow.launcher.node), and the Optuna sweeper's sampler
group, so that an app's `override hydra/sweeper/sampler: tpe` composes without that plugin."""

from __future__ import annotations

import copy
import functools
from importlib import resources

import yaml

from rayflow.launcher.node import backend_keys

# the Optuna sweeper's config group hydra/sweeper/sampler, as far as its samplers are searched here
SAMPLER_GROUP = {"tpe": "optuna.samplers.TPESampler", "random": "optuna.samplers.RandomSampler"}


@functools.cache
def _own() -> dict:
    return yaml.safe_load(
        (resources.files("hydra_plugins.rayflow_sweeper") / "rayflow.yaml").read_text()
    )


def own_keys() -> dict:
    """The sweeper's own keys and defaults, as its YAML says (a copy of what was read once)."""
    return copy.deepcopy(_own())


def sweeper_node() -> dict:
    """What ConfigStore holds as hydra/sweeper=rayflow: its own keys and every backend key, and
    the Optuna sweeper's `sampler` group in its defaults (none chosen; the node's own keys first,
    so a chosen sampler's node lands over its null)."""
    return {
        "defaults": ["_self_", {"sampler": None}],
        **own_keys(),
        **dict.fromkeys(backend_keys()),  # rayflow's own backends', as the launcher's node
    }
