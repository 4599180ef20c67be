"""backend=vm: what the key checks (vm_checks), the node commands (vm_commands) and the
rendering (vm.config) share; imports no other vm module.

The providers and node type names, the provider defaults for keys left null, the shipped
`backend:` section (conf/backend/vm.yaml), and how a section is read: over those defaults,
with the region, zone and per-node-type worker bounds it implies.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Mapping

import yaml
from omegaconf import DictConfig, OmegaConf

PROVIDERS = ("fake_multinode", "local", "aws", "gcp")
CLOUDS = ("aws", "gcp")

# The fake provider names its head node type itself (FAKE_HEAD_NODE_TYPE in Ray's
# fake_multi_node/node_provider.py); GCP puts node type names into labels, which allow no dots.
FAKE_HEAD_TYPE = "ray.head.default"
HEAD_TYPE = "rayflow_head"
WORKER_TYPES = {"cpu": "rayflow_worker_cpu", "gpu": "rayflow_worker_gpu"}

PLACEHOLDER = "<fill in: {key}>"
PLACEHOLDER_PREFIX = "<fill in: "

# Provider defaults for keys left null in conf/backend/vm.yaml.
DEFAULT_REGION = {"aws": "us-west-2", "gcp": "us-west1"}
DEFAULT_GCP_ZONE = {"us-west1": "us-west1-a"}  # other regions: the zone is the user's choice
DEFAULT_INSTANCE = {
    "aws": {"head": "m5.large", "cpu": "m5.large", "gpu": "g4dn.xlarge"},  # g4dn.xlarge: 4 vCPU, 1 T4
    "gcp": {"head": "n1-standard-2", "cpu": "n1-standard-2", "gpu": "n1-standard-4"},
}
DEFAULT_GCP_ACCELERATOR = "nvidia-tesla-t4"
GCP_IMAGE = {  # Google's Deep Learning VM families (Ray's defaults use common-cpu)
    "cpu": "projects/deeplearning-platform-release/global/images/family/common-cpu",
    "gpu": "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-nvidia-550",
}
GCP_DISK_GB = 50


# --- the shipped defaults, for the known keys ---------------------------------------------


@functools.lru_cache(maxsize=1)
def shipped_defaults() -> dict:
    """conf/backend/vm.yaml as shipped (rayflow.conf inside the wheel)."""
    text = resources.files("rayflow.conf").joinpath("backend", "vm.yaml").read_text()
    return yaml.safe_load(text)


def plain_section(section: DictConfig | Mapping) -> dict:
    if isinstance(section, DictConfig):
        return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]
    return copy.deepcopy(dict(section))


def with_defaults(section: DictConfig | Mapping) -> dict:
    """The section over the shipped defaults (a section from a file may leave keys out)."""
    return _deep_merge(shipped_defaults(), plain_section(section))


def _deep_merge(base: dict, top: Mapping) -> dict:
    """`top` over `base`: mappings merge key by key, anything else replaces; a null in
    `top` over a mapping-free key removes it (how `overrides` deletes a rendered key)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def node_type_bounds(b: dict, kind: str, gpu: bool) -> tuple[int, int]:
    """min/max workers of a node type: explicit values, or the overall ones for the type the
    run uses (GPU type with compute=gpu, CPU type otherwise) and 0..max for the other."""
    t = b["worker"][kind]
    runs_on = "gpu" if gpu else "cpu"
    low = t.get("min_workers")
    high = t.get("max_workers")
    if low is None:
        low = b["min_worker_nodes"] if kind == runs_on else 0
    if high is None:
        high = b["max_worker_nodes"]
    return int(low), int(high)


def rendered_kinds(gpu: bool) -> tuple[str, ...]:
    return ("cpu", "gpu") if gpu else ("cpu",)


def cloud_region(b: dict) -> str:
    if b.get("region"):
        return str(b["region"])
    zone = str(b.get("availability_zone") or "").split(",")[0].strip()
    if zone:
        return zone[:-1] if b["provider"] == "aws" else zone.rsplit("-", 1)[0]
    return DEFAULT_REGION[b["provider"]]


def gcp_zone(b: dict) -> str | None:
    return b.get("availability_zone") or DEFAULT_GCP_ZONE.get(cloud_region(b))


def placeholder(key: str) -> str:
    return PLACEHOLDER.format(key=f"backend.{key}")
