"""backend=vm: the rules between the keys of conf/backend/vm.yaml, which the `backend:` section's
model (rayflow.backends.vm.keys) applies: worker bounds overall and per node type, keys of
outdated guides named with their replacement, the rendering's keys refused beside
backend.cluster_yaml; and what any cluster name and ssh destination must be, wherever they come
from. The rules that depend on the provider (which keys apply to it, zones in its region, its
hosts) are the providers' (rayflow.backends.vm.providers).

The pure helpers the renderer shares (shipped_defaults, node_type_bounds) live here too, so that
the rules and the rendering read a section the same way. Imports no other vm module."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from rayflow.schema.kinds import KeyedError
from rayflow.security import ssh

# Keys of cluster YAMLs from older guides and Ray versions, and what replaced them.
REMOVED = {
    "initial_workers": (
        "backend.min_worker_nodes (Ray removed initial_workers: a cluster starts with its node "
        "types' min_workers)"
    ),
    "instance_type": (
        "backend.head_instance_type and backend.worker.cpu.instance_type / "
        "backend.worker.gpu.instance_type (one per node type)"
    ),
    "autoscaling_mode": (
        "nothing: Ray removed it, the autoscaler scales on pending resource demand; tune "
        "backend.autoscale_upscaling_speed"
    ),
    "target_utilization_fraction": (
        "backend.autoscale_upscaling_speed (Ray removed it: the autoscaler scales on pending "
        "resource demand, not utilization)"
    ),
    "min_workers": (
        "backend.min_worker_nodes (overall) and backend.worker.cpu.min_workers / "
        "backend.worker.gpu.min_workers (per node type)"
    ),
    "max_workers": (
        "backend.max_worker_nodes (overall) and backend.worker.cpu.max_workers / "
        "backend.worker.gpu.max_workers (per node type)"
    ),
    "idle_timeout_minutes": "backend.autoscale_idle_timeout_minutes",
    "upscaling_max_idle_time": "backend.autoscale_idle_timeout_minutes",
    "upscaling_speed": "backend.autoscale_upscaling_speed",
    "zone": "backend.availability_zone",
    "image_id": "backend.ami (aws) or backend.source_image (gcp)",
    "image": "backend.ami (aws) or backend.source_image (gcp)",
    "head_node": (
        "backend.head_instance_type and backend.num_cpus_head_node (Ray replaced head_node with "
        "available_node_types)"
    ),
    "worker_nodes": (
        "backend.worker.cpu / backend.worker.gpu (Ray replaced worker_nodes with "
        "available_node_types)"
    ),
    "gcp_service_account_key": (
        "Application Default Credentials: export "
        "GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json (or gcloud auth application-default "
        "login)"
    ),
    "num_worker_nodes": "backend.max_worker_nodes and backend.min_worker_nodes",
}

# The section's keys that apply to some providers only (each provider's `keys` says which), in
# the order they are refused: set for another, one would silently do nothing.
PROVIDER_KEYS = (
    "region",
    "availability_zone",
    "head_instance_type",
    "cache_stopped_nodes",
    "ami",
    "project_id",
    "source_image",
    "head_ip",
    "worker_ips",
    "ssh_user",
    "ssh_private_key",
)
# How the nodes are reached, not what the cluster is: not refused beside backend.cluster_yaml
REACHING_KEYS = ("ssh_user", "ssh_private_key")
# Keys that only say what rayflow renders: with backend.cluster_yaml the file says it instead.
RENDERING_KEYS = (
    "provider",
    "num_cpus_head_node",
    "num_gpus_head_node",
    "worker",
    *(key for key in PROVIDER_KEYS if key not in REACHING_KEYS),
)


@functools.lru_cache(maxsize=1)
def shipped_defaults() -> dict:
    """conf/backend/vm.yaml as shipped (rayflow.conf inside the wheel)."""
    return yaml.safe_load((resources.files("rayflow.conf") / "backend" / "vm.yaml").read_text())


def deep_merge(base: Mapping, top: Mapping) -> dict:
    """`top` over `base`: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def node_type_bounds(b: Mapping, kind: str, gpu: bool) -> tuple[int, int]:
    """min/max workers of a node type: explicit values, or the overall ones for the type the
    run uses (GPU type with compute=gpu, CPU type otherwise) and 0..max for the other."""
    t = b["worker"][kind]
    low, high = t.get("min_workers"), t.get("max_workers")
    if low is None:
        low = b["min_worker_nodes"] if kind == ("gpu" if gpu else "cpu") else 0
    if high is None:
        high = b["max_worker_nodes"]
    return int(low), int(high)


def rendered_kinds(gpu: bool) -> tuple[str, ...]:
    return ("cpu", "gpu") if gpu else ("cpu",)


# Any cluster name, wherever it comes from (backend.cluster_name, a user's cluster YAML,
# backend.overrides): it names the cluster's state file (rayflow.backends.vm.state), Ray's
# `/tmp/ray/cluster-NAME.state` and cloud tags, so no `/`, `..` or other character a path or a
# tag would take apart. Letters, digits, `-` and `_`, 1-63 of them, starting and ending with a
# letter or digit (the names in Ray's examples: `default`, `minimal`, `gpu-docker`).
CLUSTER_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")


def cluster_name_problem(value: Any) -> str | None:
    """Why `value` cannot be a cluster's name, or None."""
    if isinstance(value, str) and CLUSTER_NAME.fullmatch(value):
        return None
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    return (
        f"{shown} is not a cluster name: use 1-63 letters, digits, '-' and '_', starting and "
        "ending with a letter or digit"
    )


def hosts_problem(value: Any) -> str | None:
    """Why a list of hosts cannot be ssh destinations (rayflow.security.ssh), or None."""
    if not isinstance(value, list):
        return f"must be a list of host names or addresses; got {value!r}"
    return next(filter(None, map(ssh.host_problem, value)), None)


# What becomes an ssh destination, wherever backend.overrides sets it too, and its rule.
SSH_TARGETS = {
    ("provider", "head_ip"): ssh.host_problem,
    ("provider", "worker_ips"): hosts_problem,
    ("auth", "ssh_user"): ssh.user_problem,
}


def ssh_target_problem(doc: Mapping) -> tuple[str, str] | None:
    """The first key of a cluster config (dotted) that makes a bad ssh destination, and why."""
    for (section, key), rule in SSH_TARGETS.items():
        given = doc.get(section)
        if isinstance(given, Mapping) and given.get(key) is not None:
            problem = rule(given[key])
            if problem:
                return f"{section}.{key}", problem
    return None


def min_workers_rule(b: dict, gpu: bool, low: int, high: int) -> None:
    """The node types' min_workers add up to within backend.min_worker_nodes..max_worker_nodes."""
    mins = sum(node_type_bounds(b, k, gpu)[0] for k in rendered_kinds(gpu))
    if mins > high:
        raise KeyedError(
            "max_worker_nodes",
            f"({high}) is smaller than the node types' min_workers add up to ({mins})",
        )
    if mins < low:
        raise KeyedError(
            "min_worker_nodes",
            f"({low}) is more than the node types' min_workers add up to ({mins}); raise "
            f"backend.worker.{'gpu' if gpu else 'cpu'}.min_workers or lower "
            "backend.min_worker_nodes",
        )


def _changed(b: Mapping, shipped: Mapping, prefix: str = "") -> list[str]:
    """Keys of `b` (dotted, nested ones too) whose value differs from the shipped default."""
    keys = []
    for key, value in b.items():
        default = shipped.get(key)
        if isinstance(value, Mapping) and isinstance(default, Mapping):
            keys += _changed(value, default, f"{prefix}{key}.")
        elif value != default:
            keys.append(f"{prefix}{key}")
    return keys


def rendering_keys_unset(b: Mapping) -> None:
    """With backend.cluster_yaml the file holds what these keys would render: one set too would
    be silently ignored, so it is refused (set it in the file, or with backend.overrides)."""
    shipped = {k: v for k, v in shipped_defaults().items() if k in RENDERING_KEYS}
    for key in _changed({k: b[k] for k in RENDERING_KEYS}, shipped):
        raise KeyedError(
            key,
            "has no effect with backend.cluster_yaml: the file holds the cluster (its provider, "
            "hosts, node types); set it in the file, or with backend.overrides (merged into the "
            "file last)",
        )


def worker_bounds_rule(b: dict, kind_: str, gpu: bool) -> None:
    """A node type's min_workers and max_workers against each other and the overall bounds."""
    t, prefix = b["worker"][kind_], f"worker.{kind_}"
    low, high = node_type_bounds(b, kind_, gpu)
    if low > high:
        if t["min_workers"] is not None:
            raise KeyedError(
                f"{prefix}.min_workers", f"({low}) is greater than the type's max_workers ({high})"
            )
        raise KeyedError(
            f"{prefix}.max_workers",
            f"({high}) is below the type's minimum, backend.min_worker_nodes ({low})",
        )
