"""backend=vm: what the checks (vm.checks), the node commands (vm.commands), the providers
(vm.providers) and the rendering (vm.config) share; imports no other vm module but vm.rules.

The node type names rayflow renders, the placeholder of a key only the user can fill in, and how
a section is read: over the shipped `backend:` section (conf/backend/vm.yaml). Each provider's own
defaults for keys left null (instance types, region, zone, images) are its module's
(rayflow.backends.vm.providers); the per-node-type worker bounds are the schema's
(rayflow.backends.vm.rules, which holds the rules on them; rayflow.backends.vm.keys applies them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from rayflow.backends.vm.rules import deep_merge, shipped_defaults

# GCP puts node type names into labels, which allow no dots.
HEAD_TYPE = "rayflow_head"
WORKER_TYPES = {"cpu": "rayflow_worker_cpu", "gpu": "rayflow_worker_gpu"}

PLACEHOLDER = "<fill in: {key}>"
PLACEHOLDER_PREFIX = "<fill in: "


# --- reading a section -------------------------------------------------------------------


def plain_section(section: DictConfig | Mapping) -> dict:
    if isinstance(section, DictConfig):
        container = OmegaConf.to_container(section, resolve=True)
        assert isinstance(container, dict)  # the container of a DictConfig
        return container
    return copy.deepcopy(dict(section))


def with_defaults(section: DictConfig | Mapping) -> dict:
    """The section over the shipped defaults (a section from a file may leave keys out)."""
    return deep_merge(shipped_defaults(), plain_section(section))


def placeholder(key: str) -> str:
    return PLACEHOLDER.format(key=f"backend.{key}")
