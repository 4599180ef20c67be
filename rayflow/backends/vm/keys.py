"""backend=vm: every key of conf/backend/vm.yaml, its kind and meaning: `Vm`, the model of the
`backend:` section, with its node types. The rules between keys (worker bounds overall and per
node type, keys of outdated guides named with their replacement) are declared in
rayflow.backends.vm.rules, those that depend on the provider (keys that apply to some providers
only, zones in the region, the hosts of provider=local) in rayflow.backends.vm.providers, and
`Vm`'s validators apply them.

What needs this machine (`ssh` and `rsync` on PATH, the SSH key file readable) stays in
rayflow/backends/vm/checks.py, and Ray's own validation checks the cluster YAML rendered from
these keys."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from rayflow.backends.vm import providers
from rayflow.backends.vm.rules import (
    REMOVED,
    cluster_name_problem,
    deep_merge,
    hosts_problem,
    min_workers_rule,
    rendering_keys_unset,
    shipped_defaults,
    ssh_target_problem,
)
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


def _hosts(value: Any) -> list:
    if not isinstance(value, list) or not all(isinstance(ip, str) and ip.strip() for ip in value):
        raise ValueError(f"must be a list of host names or addresses; got {value!r}")
    if len(set(value)) != len(value):
        raise ValueError("lists a host twice")
    problem = hosts_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _checked(rule: Any) -> Any:
    def check(value: Any) -> str:
        problem = rule(value)
        if problem:
            raise ValueError(problem)
        return str(value)

    return check


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
    provider: OneOf(*providers.TYPES) = Field(
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
            rendering_keys_unset(b)
            return self
        for kind_ in ("cpu", "gpu"):
            providers.node_type_rules(b, kind_, gpu)
        if gpu and self.worker.gpu.num_gpus < 1:
            raise KeyedError(
                "worker.gpu.num_gpus",
                "must be >= 1 for the GPU node type with compute=gpu; got "
                f"{self.worker.gpu.num_gpus!r}",
            )
        if not providers.get(provider).hosts:  # the hosts are the one node type
            min_workers_rule(b, gpu, low, high)
        providers.section_rules(b)
        return self
