"""backend=vm: every key of conf/backend/vm.yaml, its kind and meaning, and the rules between
keys: worker bounds overall and per node type, keys that apply to some providers only, zones in
the region, the hosts of provider=local, keys of outdated guides named with their replacement.

What needs this machine (`ssh` and `rsync` on PATH, the SSH key file readable) stays in
rayflow/backends/vm/checks.py, and Ray's own validation checks the cluster YAML rendered from
these keys. The pure helpers the renderer shares (node_type_bounds, cloud_region) live here so
that the rules and the rendering read a section the same way."""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml
from pydantic import Field, ValidationInfo, model_validator

from rayflow.schema.kinds import (
    BYTES_MAX,
    RAY_MIN_OBJECT_STORE,
    Boolean,
    IdleMinutes,
    KeyedError,
    Number,
    OneOf,
    OptionalText,
    Text,
    kind,
)
from rayflow.schema.root import DeviceKind, Part, Section
from rayflow.security import ssh

PROVIDERS = ("fake_multinode", "local", "aws", "gcp")
CLOUDS = ("aws", "gcp")
DEFAULT_REGION = {"aws": "us-west-2", "gcp": "us-west1"}

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

# Keys that apply to some providers only: set on another they would silently do nothing.
ONLY_FOR = {
    "region": CLOUDS,
    "availability_zone": CLOUDS,
    "head_instance_type": CLOUDS,
    "cache_stopped_nodes": CLOUDS,
    "ami": ("aws",),
    "project_id": ("gcp",),
    "source_image": ("gcp",),
    "head_ip": ("local",),
    "worker_ips": ("local",),
    "ssh_user": ("local", "aws", "gcp"),
    "ssh_private_key": ("local", "aws", "gcp"),
}
# Keys that only say what rayflow renders: with backend.cluster_yaml the file says it instead.
RENDERING_KEYS = (
    "provider",
    "num_cpus_head_node",
    "num_gpus_head_node",
    "head_instance_type",
    "worker",
    "region",
    "availability_zone",
    "cache_stopped_nodes",
    "ami",
    "project_id",
    "source_image",
    "head_ip",
    "worker_ips",
)
TYPE_ONLY_FOR = {
    "instance_type": CLOUDS,
    "accelerator_type": ("gcp",),
    "spot": CLOUDS,
    "min_workers": ("fake_multinode", "aws", "gcp"),
    "max_workers": ("fake_multinode", "aws", "gcp"),
}


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


def cloud_region(b: Mapping) -> str:
    """backend.region, else the region of the first availability zone, else the provider's
    default."""
    if b.get("region"):
        return str(b["region"])
    zone = str(b.get("availability_zone") or "").split(",")[0].strip()
    if zone:
        return zone[:-1] if b["provider"] == "aws" else zone.rsplit("-", 1)[0]
    return DEFAULT_REGION[b["provider"]]


def Whole(minimum: int, optional: bool = False) -> Any:
    """A whole number: Ray's cluster config takes whole CPUs, GPUs and bytes."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            why = (
                " (Ray's cluster config takes whole CPUs, GPUs and bytes)"
                if isinstance(value, float)
                else ""
            )
            raise ValueError(
                f"must be a whole number >= {minimum}{' or null' if optional else ''}{why}; got "
                f"{value!r}"
            )
        if value > BYTES_MAX:  # every number is bounded (rayflow.schema.kinds)
            raise ValueError(f"must be at most 2**50, got {value!r}")
        return value

    return kind(f"whole number in [{minimum}, 2**50]", check, optional)


def _cluster_name(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9-]{0,39}", value):
        raise ValueError(
            "must be 1-40 lowercase letters, digits and dashes, starting with a letter (cloud "
            f"labels and instance names carry it); got {value!r}"
        )
    return value


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


def _hosts(value: Any) -> list:
    if not isinstance(value, list) or not all(isinstance(ip, str) and ip.strip() for ip in value):
        raise ValueError(f"must be a list of host names or addresses; got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError("lists a host twice")
    problem = _hosts_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _hosts_problem(value: Any) -> str | None:
    """Why a list of hosts cannot be ssh destinations (rayflow.security.ssh), or None."""
    if not isinstance(value, list):
        return f"must be a list of host names or addresses; got {value!r}"
    return next(filter(None, map(ssh.host_problem, value)), None)


def _checked(rule: Any) -> Any:
    def check(value: Any) -> str:
        problem = rule(value)
        if problem:
            raise ValueError(problem)
        return str(value)

    return check


# What becomes an ssh destination, wherever backend.overrides sets it too, and its rule.
SSH_TARGETS = {
    ("provider", "head_ip"): ssh.host_problem,
    ("provider", "worker_ips"): _hosts_problem,
    ("auth", "ssh_user"): ssh.user_problem,
}


def _key_file(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("must be the path of a private key file or null")
    return value


def _file_path(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"must be the path of a Ray cluster YAML (what `ray up` takes) or null; got {value!r}"
        )
    return value


def _overrides(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError(
            f"must be a mapping (deep-merged into the rendered cluster config); got {value!r}"
        )
    if "cluster_name" in value and cluster_name_problem(value["cluster_name"]):
        raise ValueError(f"cluster_name: {cluster_name_problem(value['cluster_name'])}")
    found = ssh_target_problem(value)
    if found:
        raise ValueError(": ".join(found))
    return value


def ssh_target_problem(doc: Mapping) -> tuple[str, str] | None:
    """The first key of a cluster config (dotted) that makes a bad ssh destination, and why."""
    for (section, key), rule in SSH_TARGETS.items():
        given = doc.get(section)
        if isinstance(given, Mapping) and given.get(key) is not None:
            problem = rule(given[key])
            if problem:
                return f"{section}.{key}", problem
    return None


class CpuNodeType(Part):
    num_cpus: Whole(0, optional=True) = Field(
        description="the node's Ray CPUs (2 matches m5.large / n1-standard-2); null: detected by "
        "Ray, refused with provider=fake_multinode (its nodes are processes here)"
    )
    num_gpus: Whole(0, optional=True) = Field(description="the node's Ray GPUs")
    memory: Whole(1, optional=True) = Field(
        description="bytes of Ray's memory resource per node (null: what the node has)"
    )
    object_store_memory: Whole(RAY_MIN_OBJECT_STORE, optional=True) = Field(
        description="bytes of object store per node (null: Ray's default)"
    )
    min_workers: Whole(0, optional=True) = Field(
        description="nodes of this type kept up (null: `min_worker_nodes` when the run uses this "
        "type, else 0); not with provider=local (the hosts are the node type)"
    )
    max_workers: Whole(0, optional=True) = Field(
        description="nodes of this type at most (null: `max_worker_nodes`); not with provider=local"
    )
    instance_type: OptionalText = Field(
        description="aws/gcp; null: m5.large (aws), n1-standard-2 (gcp)"
    )
    spot: Boolean = Field(
        description="aws/gcp: spot (preemptible) VMs for this worker type, the head staying "
        "on-demand; a trial on a reclaimed VM restarts from its last checkpoint "
        "(workload.max_failures)"
    )

    @classmethod
    def check_keys(cls, value: dict) -> None:
        for key in value:
            if key not in cls.model_fields:
                raise KeyedError(
                    key, f"is not a key of a node type; use one of {', '.join(cls.model_fields)}"
                )


class GpuNodeType(CpuNodeType):
    num_cpus: Whole(1, optional=True) = Field(
        description="the node's Ray CPUs (4 matches g4dn.xlarge / n1-standard-4)"
    )
    num_gpus: Whole(0) = Field(description="the node's GPUs: >= 1 with compute=gpu")
    instance_type: OptionalText = Field(
        description="aws/gcp; null: g4dn.xlarge (aws, 1 T4), n1-standard-4 (gcp)"
    )
    accelerator_type: OptionalText = Field(
        description="gcp; null: nvidia-tesla-t4 (`num_gpus` of them per node)"
    )


class NodeTypes(Part):
    cpu: CpuNodeType = Field(description="the CPU node type, always rendered")
    gpu: GpuNodeType = Field(description="the GPU node type, rendered only with compute=gpu")

    @classmethod
    def check_keys(cls, value: dict) -> None:
        for name in value:
            if name not in cls.model_fields:
                raise KeyedError(
                    str(name),
                    "is not a node type of backend=vm; use backend.worker.cpu or "
                    "backend.worker.gpu",
                )


class Vm(Section):
    name: Text = Field(
        description="`vm`: Ray's cluster launcher (fake_multinode, SSH hosts, aws, gcp), the run "
        "submitted as a Ray Job"
    )
    cluster_yaml: kind("path of a Ray cluster YAML", _file_path, optional=True) = Field(
        description="your own Ray cluster YAML (what `ray up` takes: aws, gcp, azure, local, "
        "fake_multinode) started as it is; the keys of the rendered config (`provider`, "
        "`head_ip`, `region`, `worker`, ...) are then refused, and the others apply on top "
        "of the file only where they differ from their default (docs/backends/vm.md)"
    )
    provider: OneOf(*PROVIDERS) = Field(
        description="`fake_multinode`: Ray's real autoscaler launching worker nodes as processes "
        "on this machine (no cloud, no SSH); `local`: your hosts over SSH (`head_ip`, "
        "`worker_ips`); `aws`, `gcp`: VMs the launcher creates with your cloud credentials"
    )
    cluster_name: kind("1-40 lowercase letters, digits and dashes", _cluster_name) = Field(
        description="names the VMs and their tags"
    )
    keep_cluster: Boolean = Field(
        description="leave the cluster running at the end (a later run reuses it)"
    )
    autostop_idle_minutes: IdleMinutes = Field(
        description="tear the cluster down after this many minutes with no job, no connected "
        "driver and no waiting demand, by a watcher that runs on the cluster itself (no client "
        "needed); null: 60 for a kept cluster (`keep_cluster=true`), else never; 0: never"
    )
    compute_device: DeviceKind = Field(
        default="cpu", description="set by `compute=...`: with `cuda` the GPU node type is rendered"
    )
    start_timeout_s: Number() = Field(
        description="how long bringing the head node up may take (VMs boot, install)"
    )
    min_worker_nodes: Whole(0) = Field(
        description="worker nodes kept up in all (of the type the run uses)"
    )
    max_worker_nodes: Whole(0) = Field(
        description="worker nodes at most in all (Ray's `max_workers`)"
    )
    autoscale_idle_timeout_minutes: Number(allow_zero=True) = Field(
        description="a worker node idle this long is removed (down to the minimum)"
    )
    autoscale_upscaling_speed: Number() = Field(
        description="nodes added at once, as a multiple of the nodes running"
    )
    num_cpus_head_node: Whole(0) = Field(
        description="the head's Ray CPUs (0: trials go to the workers; the head runs the "
        "autoscaler and the driver)"
    )
    num_gpus_head_node: Whole(0) = Field(description="the head's Ray GPUs")
    head_instance_type: OptionalText = Field(
        description="aws/gcp; null: m5.large (aws), n1-standard-2 (gcp)"
    )
    dashboard_host: OptionalText = Field(
        description="null: 127.0.0.1 on the head (rayflow reaches it through an SSH tunnel, as "
        "`ray dashboard` does); an address beyond loopback needs `ray_auth_mode=token`"
    )
    worker: NodeTypes = Field(description="the worker node types")
    region: OptionalText = Field(
        description="aws/gcp; null: us-west-2 (aws), us-west1 (gcp), or the zone's region"
    )
    availability_zone: OptionalText = Field(
        description="aws/gcp, inside the region; aws: null lets Ray choose (or "
        "`us-west-2a,us-west-2b`); gcp: null is us-west1-a in us-west1, else fill in"
    )
    cache_stopped_nodes: Boolean = Field(
        description="aws/gcp: stop idle VMs instead of terminating them (their disks keep billing)"
    )
    ami: OptionalText = Field(description="aws; null: Ray's Deep Learning AMI for the region")
    project_id: OptionalText = Field(description="gcp: your project id (only you can fill it in)")
    source_image: OptionalText = Field(
        description="gcp boot image; null: Google's Deep Learning VM image (CUDA on the GPU type)"
    )
    head_ip: kind("a host name or IP address", _checked(ssh.host_problem), optional=True) = Field(
        description="provider=local: the head host's address (only you can fill it in)"
    )
    worker_ips: kind("a list of host names or addresses", _hosts, optional=True) = Field(
        description="provider=local: the worker hosts, each once, not the head; at least "
        "`max_worker_nodes` of them"
    )
    ssh_user: kind("a user name", _checked(ssh.user_problem), optional=True) = Field(
        description="local, aws, gcp; aws/gcp: null is ubuntu"
    )
    ssh_private_key: kind("path of a private key file", _key_file, optional=True) = Field(
        description="local, aws, gcp: the key file, readable here; aws/gcp: null lets Ray create "
        "a key pair"
    )
    overrides: kind("a mapping", _overrides) = Field(
        description="anything else of Ray's cluster YAML, deep-merged into the rendered config "
        "last (a null deletes a key), e.g. `{provider: {use_internal_ips: true}}`"
    )

    @model_validator(mode="before")
    @classmethod
    def _known_keys_over_defaults(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        for key in value:
            if key in REMOVED:
                raise KeyedError(
                    key,
                    "is not a backend=vm key (it comes from an outdated cluster YAML); use "
                    f"{REMOVED[key]}",
                )
            if key not in cls.model_fields:
                raise KeyedError(
                    key,
                    "is not a backend=vm key; Ray cluster-YAML settings go under "
                    "backend.overrides (deep-merged into the rendered config)",
                )
        # A section from a file may leave keys out: the shipped defaults fill them, as the
        # renderer does (vm.defaults.with_defaults). Not the interpolations: they mean Hydra's
        # config, not this section.
        shipped = {
            k: v
            for k, v in shipped_defaults().items()
            if not (isinstance(v, str) and v.startswith("${"))
        }
        return deep_merge(shipped, value)

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> Vm:
        b, provider, gpu = self.model_dump(), self.provider, self.compute_device == "cuda"
        low, high = self.min_worker_nodes, self.max_worker_nodes
        if low > high:
            raise KeyedError(
                "min_worker_nodes", f"({low}) is greater than backend.max_worker_nodes ({high})"
            )
        if self.cluster_yaml is not None:
            # the file holds the cluster: the rendering's keys have nothing to render
            _rendering_keys_unset(b)
            return self
        for kind_ in ("cpu", "gpu"):
            _node_type_rules(b, kind_, gpu)
        if gpu and self.worker.gpu.num_gpus < 1:
            raise KeyedError(
                "worker.gpu.num_gpus",
                "must be >= 1 for the GPU node type with compute=gpu; got "
                f"{self.worker.gpu.num_gpus!r}",
            )
        if provider != "local":
            _min_workers_rule(b, gpu, low, high)
        _provider_rules(self, b)
        return self


def _min_workers_rule(b: dict, gpu: bool, low: int, high: int) -> None:
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


def _provider_rules(vm: Vm, b: dict) -> None:
    """Keys of other providers left at their default; zones inside the region; provider=local's
    hosts, enough of them and the head not among the workers."""
    provider, high = vm.provider, vm.max_worker_nodes
    for key, providers in ONLY_FOR.items():
        if b[key] not in (None, shipped_defaults().get(key)) and provider not in providers:
            raise KeyedError(
                key,
                f"has no effect with provider={provider} (it applies to {', '.join(providers)})",
            )
    if provider in CLOUDS:
        region = cloud_region(b)
        for zone in str(vm.availability_zone or "").split(","):
            if zone.strip() and not zone.strip().startswith(
                region if provider == "aws" else f"{region}-"
            ):
                raise KeyedError(
                    "availability_zone", f"{zone.strip()!r} is not in backend.region {region!r}"
                )
    if provider == "local" and vm.worker_ips is not None:
        if vm.head_ip in vm.worker_ips:
            raise KeyedError("worker_ips", "lists the head (backend.head_ip) as a worker")
        if vm.worker_ips and high > len(vm.worker_ips):
            raise KeyedError(
                "max_worker_nodes",
                f"({high}) is more than the {len(vm.worker_ips)} hosts in backend.worker_ips",
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


def _rendering_keys_unset(b: Mapping) -> None:
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


def _node_type_rules(b: dict, kind_: str, gpu: bool) -> None:
    """A node type against the provider and the overall bounds."""
    t, prefix, provider = b["worker"][kind_], f"worker.{kind_}", b["provider"]
    if t["num_cpus"] is None and provider == "fake_multinode":
        raise KeyedError(
            f"{prefix}.num_cpus",
            "must be set with provider=fake_multinode (its worker nodes are processes here: "
            "nothing to detect)",
        )
    for key, providers in TYPE_ONLY_FOR.items():
        if t.get(key) not in (None, False) and provider not in providers:
            hint = (
                "; the hosts are the node type: use backend.min_worker_nodes / max_worker_nodes"
                if provider == "local" and "workers" in key
                else ""
            )
            raise KeyedError(
                f"{prefix}.{key}",
                f"has no effect with provider={provider} (it applies to "
                f"{', '.join(providers)}){hint}",
            )
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
