"""backend=vm: what the checks (vm.checks), the node commands (vm.commands) and the rendering
(vm.config) share; imports no other vm module but vm.rules.

The node type names, the provider defaults for keys left null, and how a section is read: over
the shipped `backend:` section (conf/backend/vm.yaml), with the zone it implies. The providers,
the region and the per-node-type worker bounds are the schema's (rayflow.backends.vm.rules, which
holds the rules on them; rayflow.backends.vm.keys applies them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from omegaconf import DictConfig, OmegaConf

from rayflow.backends.vm.rules import cloud_region, deep_merge, shipped_defaults

# The fake provider names its head node type itself (FAKE_HEAD_NODE_TYPE in Ray's
# fake_multi_node/node_provider.py); GCP puts node type names into labels, which allow no dots.
FAKE_HEAD_TYPE = "ray.head.default"
HEAD_TYPE = "rayflow_head"
WORKER_TYPES = {"cpu": "rayflow_worker_cpu", "gpu": "rayflow_worker_gpu"}

PLACEHOLDER = "<fill in: {key}>"
PLACEHOLDER_PREFIX = "<fill in: "

# Provider defaults for keys left null in conf/backend/vm.yaml.
DEFAULT_GCP_ZONE = {"us-west1": "us-west1-a"}  # other regions: the zone is the user's choice
DEFAULT_INSTANCE = {
    "aws": {
        "head": "m5.large",
        "cpu": "m5.large",
        "gpu": "g4dn.xlarge",
    },  # g4dn.xlarge: 4 vCPU, 1 T4
    "gcp": {"head": "n1-standard-2", "cpu": "n1-standard-2", "gpu": "n1-standard-4"},
}
DEFAULT_GCP_ACCELERATOR = "nvidia-tesla-t4"
GCP_IMAGE = {  # Google's Deep Learning VM families (Ray's defaults use common-cpu)
    "cpu": "projects/deeplearning-platform-release/global/images/family/common-cpu",
    "gpu": (
        "projects/deeplearning-platform-release/global/images/family/"
        "common-cu124-ubuntu-2204-nvidia-550"
    ),
}
GCP_DISK_GB = 50


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


def gcp_zone(b: dict) -> str | None:
    return b.get("availability_zone") or DEFAULT_GCP_ZONE.get(cloud_region(b))


def placeholder(key: str) -> str:
    return PLACEHOLDER.format(key=f"backend.{key}")
