"""backend=kuberay: every key of conf/backend/kuberay.yaml, its kind and meaning, and the rules
between keys: names as Kubernetes and KubeRay take them, quantities, replica bounds per worker
group, rayVersion against the image's tag, the RayJob's TTL against its shutdown.

What needs the rendered manifest (KubeRay's CRD schema, the operator's rules on what
backend.overrides adds) or this machine (the installed Ray, when neither backend.ray_version nor
the image says which) stays in rayflow/backends/kuberay/checks.py. The pure helpers the
renderer shares (replica_bounds, image_ray_version, parse_quantity, is_dns_label) live here so
that the rules and the manifest read a section the same way."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pydantic import Field, model_validator

from rayflow.schema.kinds import (
    BYTES_MAX,
    Boolean,
    IdleMinutes,
    Integer,
    KeyedError,
    Number,
    OneOf,
    OptionalText,
    Text,
    kind,
)
from rayflow.schema.root import DeviceKind, Part, Section

# MaxRayClusterNameLength and MaxRayJobNameLength (= 53 - 6) of KubeRay's utils/constant.go.
MAX_NAME = {"RayCluster": 53, "RayJob": 47}
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")

# Kubernetes' quantity grammar (k8s.io/apimachinery resource.ParseQuantity): a signed decimal
# and one suffix, binary (Ki..Ei), decimal (n u m k M G T P E) or an exponent (e3, E-2).
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$"
)
_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity ("500m", "4Gi", 2) as a Decimal, or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    match = _QUANTITY.match(str(value))
    if not match:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIX.get(suffix, Decimal(1))


def is_dns_label(text: str) -> bool:
    """A DNS-1123 label (a namespace name): at most 63 of a-z, 0-9, '-', alphanumeric at both
    ends."""
    return len(text) <= 63 and bool(DNS_1123_LABEL.match(text))


def image_ray_version(image: str | None) -> str | None:
    """The Ray version of an image tag: rayproject/ray:2.52.0-py311-gpu -> 2.52.0."""
    tag = str(image or "").rpartition("/")[2].partition("@")[0]
    match = re.match(r"^[^:]+:(\d+\.\d+\.\d+)(?:$|-)", tag)
    return match.group(1) if match else None


def run_group(gpu: bool) -> str:
    return "gpu" if gpu else "cpu"


def replica_bounds(b: Mapping, name: str, gpu: bool) -> tuple[int, int, int]:
    """(replicas, min, max) of a group: explicit values, else min_worker_nodes for the group the
    run uses and 0 for the others, max_worker_nodes, and replicas = min."""
    group = b["worker_groups"][name]
    low = group.get("min_replicas")
    if low is None:
        low = b["min_worker_nodes"] if name == run_group(gpu) else 0
    high = group.get("max_replicas")
    if high is None:
        high = b["max_worker_nodes"]
    replicas = group.get("replicas")
    return int(low if replicas is None else replicas), int(low), int(high)


def _quantity(value: Any) -> Any:
    amount = parse_quantity(value)
    if amount is None or amount <= 0:
        raise ValueError(
            "must be a Kubernetes quantity > 0 (e.g. 500m, 2, 4Gi, 512Mi: no spaces); got "
            f"{value!r}"
        )
    if amount > BYTES_MAX:  # every number is bounded (rayflow.schema.kinds)
        raise ValueError(f"must be at most 1Pi, got {value!r}")
    return value


def _namespace(value: Any) -> str:
    if not isinstance(value, str) or not is_dns_label(value):
        raise ValueError(f"must be a Kubernetes namespace name (DNS-1123 label); got {value!r}")
    return value


def _image(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"must be an image reference or null; got {value!r}")
    return value


def _ray_version(value: Any) -> str:
    if not re.fullmatch(r"\d+\.\d+\.\d+", str(value)):
        raise ValueError(f"must be a Ray version like 2.60.0, or null; got {value!r}")
    return str(value)


# metadata.uid: the API server gives each object an RFC 4122 UUID, lowercase
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _uid(value: Any) -> str:
    if not isinstance(value, str) or not _UID.fullmatch(value):
        raise ValueError(
            "must be the RayCluster's metadata.uid as `kubectl get raycluster NAME -n NAMESPACE "
            f"-o jsonpath='{{.metadata.uid}}'` prints it (8-4-4-4-12 hex), or null; got {value!r}"
        )
    return value


def _node_selector(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping of node label to value; got {value!r}")
    return value


def _tolerations(value: Any) -> list:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of Kubernetes tolerations; got {value!r}")
    return value


def _pip(value: Any) -> list:
    if not isinstance(value, list) or not all(isinstance(p, str) and p.strip() for p in value):
        raise ValueError(
            "must be null (rayflow's dependencies, pinned) or a list of pip requirements; got "
            f"{value!r}"
        )
    return value


def _overrides(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping (deep-merged into the manifest); got {value!r}")
    return value


Quantity = kind("a Kubernetes quantity > 0", _quantity)
NodeSelector = kind("a mapping", _node_selector, optional=True)
Tolerations = kind("a list", _tolerations, optional=True)


class Autoscaler(Part):
    cpu: Quantity = Field(description="the autoscaler sidecar container's CPU (requests = limits)")
    memory: Quantity = Field(description="the autoscaler sidecar container's memory")


class Head(Part):
    num_cpus: Integer(0) = Field(
        description="rayStartParams `num-cpus`: the head's Ray CPUs (0: trials go to the workers)"
    )
    cpu: Quantity = Field(description="the head container's CPU, requests and limits")
    memory: Quantity = Field(description="the head container's memory, requests and limits")
    node_selector: NodeSelector = Field(description="the head pod's nodeSelector")
    tolerations: Tolerations = Field(description="the head pod's tolerations")


class WorkerGroup(Part):
    cpu: Quantity = Field(
        description="each pod's CPU, requests and limits (Ray's CPUs, rounded up)"
    )
    memory: Quantity = Field(description="each pod's memory, requests and limits")
    gpu: Integer(0) = Field(
        default=0,
        description="`nvidia.com/gpu` limits (whole devices), with the matching toleration; >= 1 "
        "for the GPU group with compute=gpu",
    )
    replicas: Integer(0, optional=True) = Field(
        default=None, description="pods at the start (null: `min_replicas`)"
    )
    min_replicas: Integer(0, optional=True) = Field(
        default=None,
        description="pods kept up (null: `min_worker_nodes` for the group the run "
        "uses, else 0); at most `max_replicas`",
    )
    max_replicas: Integer(0, optional=True) = Field(
        default=None, description="pods at most (null: `max_worker_nodes`)"
    )
    node_selector: NodeSelector = Field(default=None, description="the pods' nodeSelector")
    tolerations: Tolerations = Field(default=None, description="the pods' tolerations")

    @classmethod
    def check_keys(cls, value: dict) -> None:
        for key in value:
            if key not in cls.model_fields:
                raise KeyedError(
                    key, f"is not a key of a worker group; use one of {', '.join(cls.model_fields)}"
                )


class WorkerGroups(Part):
    # Groups a user adds (`+backend.worker_groups.NAME={cpu: ..., memory: ...}`) are worker groups
    # too.
    __pydantic_extra__: dict[str, WorkerGroup] = Field(init=False)

    cpu: WorkerGroup = Field(description="the CPU group, always rendered")
    # Optional: with compute=cpu a section may drop it (`~backend.worker_groups.gpu`).
    gpu: WorkerGroup | None = Field(
        default=None, description="the GPU group, rendered only with compute=gpu (needed then)"
    )

    @classmethod
    def check_keys(cls, value: dict) -> None:
        for name in value:
            if not DNS_1123_LABEL.match(str(name)):
                raise KeyedError(
                    str(name),
                    "must be named with lowercase letters, digits and '-' (pod names carry it)",
                )


class RayJobOptions(Part):
    shutdown_after_job_finishes: Boolean = Field(
        description="the operator deletes the cluster once the job ends"
    )
    ttl_seconds_after_finished: Integer(0, optional=True) = Field(
        description="... this long after it ends (> 0 needs `shutdown_after_job_finishes`)"
    )
    active_deadline_seconds: Integer(1, optional=True) = Field(
        description="the whole RayJob may run this long, then it fails and its cluster goes"
    )
    pre_running_deadline_seconds: Integer(1, optional=True) = Field(
        description="the job must be submitted (Running) within this (InteractiveMode)"
    )


class Kuberay(Section):
    name: Text = Field(
        description="`kuberay`: a RayCluster or RayJob made by the KubeRay operator, the run "
        "submitted as a Ray Job"
    )
    manifest: OptionalText = Field(
        default=None,
        description="a RayCluster or RayJob manifest file (yours, as it is) to apply instead of "
        "the one rendered from these keys; one RayCluster/RayJob document, other documents left "
        "for you to `kubectl apply`; keys that differ from their default and `overrides` apply on "
        'top (docs/backends/kuberay.md, "Your own manifest"); null: rendered from the keys',
    )
    mode: OneOf("cluster", "rayjob") = Field(
        description="`cluster`: apply a RayCluster, submit the run to it, delete it at the end "
        "(unless `keep_cluster`); `rayjob`: apply a RayJob (InteractiveMode) whose cluster "
        "the operator deletes once the job ends"
    )
    cluster_name: Text = Field(
        description="the RayCluster's (or RayJob's) name: a DNS-1035 label, <= 53 characters (47 "
        "for a RayJob)"
    )
    namespace: kind("a DNS-1123 label", _namespace) = Field(
        description="the namespace everything is applied in"
    )
    kubeconfig: OptionalText = Field(
        description="null: `$KUBECONFIG` or `~/.kube/config`; inside a pod, its service account"
    )
    context: OptionalText = Field(description="the kubeconfig context; null: the current one")
    keep_cluster: Boolean = Field(
        description="leave the RayCluster running at the end (a later run reuses it)"
    )
    join_uid: kind("a Kubernetes uid", _uid, optional=True) = Field(
        description="run on the existing RayCluster `cluster_name` that has this metadata.uid, "
        "one rayflow did not make (or another user's): your statement that you trust it, since "
        "the job and its secrets go to its head; with `keep_cluster=true`, which it is left "
        "running by. null: a run joins only a cluster this user's own run kept"
    )
    autostop_idle_minutes: IdleMinutes = Field(
        description="tear the cluster down after this many minutes with no job, no connected "
        "driver and no waiting demand, by a watcher that runs on the cluster itself (no client "
        "needed); null: 60 for a kept cluster (`keep_cluster=true`), else never; 0: never"
    )
    compute_device: DeviceKind = Field(
        default="cpu",
        description="set by `compute=...`: with `cuda` the GPU worker group is rendered",
    )
    image: kind("an image reference", _image, optional=True) = Field(
        description="null: `rayproject/ray:<installed Ray>-py<major><minor>` (`-gpu` on GPU groups)"
    )
    ray_version: kind("a Ray version (2.60.0)", _ray_version, optional=True) = Field(
        description="`rayVersion`; null: from the image's tag, else the installed Ray; must "
        "match the image's tag"
    )
    service_type: OneOf("ClusterIP", "NodePort", "LoadBalancer") = Field(
        description="the head service's type"
    )
    dashboard_access: OneOf("auto", "proxy", "service") = Field(
        description="how this client reaches the head's dashboard (Jobs API): `proxy`, the API "
        "server's service proxy through a relay on 127.0.0.1 that adds your Kubernetes "
        "credentials and the Ray token; `service`, the head service's cluster DNS name "
        "(rayflow runs in the cluster); `auto`: service inside a pod, else proxy"
    )
    start_timeout_s: Number() = Field(
        description="the head pod may take this long to become ready (pulls, scheduling)"
    )
    schedule_grace_s: Number() = Field(
        description="a head pod unschedulable (FailedScheduling) this long fails the run"
    )
    delete_timeout_s: Number() = Field(
        description="how long deleting may take until every pod of the cluster is gone"
    )
    enable_in_tree_autoscaling: Boolean = Field(
        description="the Ray autoscaler sidecar scales worker pods between min and max"
    )
    autoscaler_version: OneOf("v1", "v2") = Field(
        description="v2 needs restartPolicy Never on Ray pods, rendered so"
    )
    min_worker_nodes: Integer(0) = Field(
        description="worker pods kept up (of the group the run uses)"
    )
    max_worker_nodes: Integer(0) = Field(
        description="worker pods at most (of the group the run uses)"
    )
    autoscale_idle_timeout_minutes: Number(allow_zero=True) = Field(
        description="a worker pod idle this long is removed (`idleTimeoutSeconds` = x 60)"
    )
    autoscale_upscaling_speed: Number() = Field(
        description="<= 1: `upscalingMode` Conservative; above: Default (Ray maps both "
        "Default and Aggressive to 1000)"
    )
    upscaling_mode: OneOf("Default", "Conservative", "Aggressive", optional=True) = Field(
        description="null: from `autoscale_upscaling_speed`"
    )
    autoscaler: Autoscaler = Field(description="the autoscaler sidecar container's resources")
    head: Head = Field(
        description="the head pod: the autoscaler, the GCS, the dashboard and the job's driver; "
        "no trials"
    )
    worker_groups: WorkerGroups = Field(
        description="the worker groups (Kubernetes quantities; Ray reads its CPUs, GPUs and "
        "memory from them); add one with `+backend.worker_groups.NAME={cpu: ..., memory: ...}`"
    )
    job_pip: kind("a list of pip requirements", _pip, optional=True) = Field(
        description="what the job installs (runtime_env pip): null, rayflow's dependencies "
        "pinned to this machine's versions (rayproject/ray images lack them); `[]` with an "
        "image built from backends/kuberay/Dockerfile; or your own list"
    )
    rayjob: RayJobOptions = Field(description="`mode=rayjob`: the RayJob's own lifecycle")
    overrides: kind("a mapping", _overrides, optional=True) = Field(
        description="anything else of the manifest, deep-merged into what rayflow renders last "
        "(a null deletes a key), e.g. `{spec: {headGroupSpec: {serviceType: NodePort}}}`; "
        "validated against KubeRay's CRD like the rest"
    )

    @model_validator(mode="after")
    def _rules(self) -> Kuberay:
        b, gpu = self.model_dump(), self.compute_device == "cuda"
        b["worker_groups"] = {
            name: group for name, group in b["worker_groups"].items() if group is not None
        }
        _name_rules(self.cluster_name, "RayJob" if self.mode == "rayjob" else "RayCluster")
        if self.min_worker_nodes > self.max_worker_nodes:
            raise KeyedError(
                "min_worker_nodes",
                f"({self.min_worker_nodes}) is greater than backend.max_worker_nodes "
                f"({self.max_worker_nodes})",
            )
        for name, group in b["worker_groups"].items():
            _, low, high = replica_bounds(b, name, gpu)
            if low > high:  # ValidateRayClusterSpec: "minReplicas greater than maxReplicas"
                key = "min_replicas" if group["min_replicas"] is not None else "max_replicas"
                raise KeyedError(
                    f"worker_groups.{name}.{key}",
                    f"worker group {name} has minReplicas {low} greater than maxReplicas {high}",
                )
        if gpu:
            _gpu_group_rules(self.worker_groups.gpu)
        tagged = image_ray_version(self.image)
        if self.ray_version is not None and tagged is not None and self.ray_version != tagged:
            raise KeyedError(
                "ray_version",
                f"is {self.ray_version} but backend.image runs Ray {tagged} (rayVersion must "
                "match the image)",
            )
        if self.join_uid is not None and (self.mode != "cluster" or not self.keep_cluster):
            raise KeyedError(
                "join_uid",
                "runs on an existing RayCluster, which rayflow then leaves running: it needs "
                "backend.keep_cluster=true (and backend.mode=cluster)",
            )
        job = self.rayjob
        if (
            self.mode == "rayjob"
            and not job.shutdown_after_job_finishes
            and (job.ttl_seconds_after_finished or 0) > 0
        ):
            raise KeyedError(
                "rayjob.ttl_seconds_after_finished",
                "a RayJob with shutdownAfterJobFinishes set to false cannot have "
                "TTLSecondsAfterFinished (set backend.rayjob.shutdown_after_job_finishes=true or "
                "the TTL to 0)",
            )
        return self


def _name_rules(name: str, what: str) -> None:
    """ValidateRayClusterMetadata / ValidateRayJobMetadata."""
    if len(name) > MAX_NAME[what]:
        raise KeyedError(
            "cluster_name",
            f"{what} name should be no more than {MAX_NAME[what]} characters; got {name!r}",
        )
    if not DNS_1035.fullmatch(name):
        raise KeyedError(
            "cluster_name",
            f"{what} name should be a valid DNS1035 label (lowercase letters, digits and '-', "
            f"starting with a letter); got {name!r}",
        )


def _gpu_group_rules(group: WorkerGroup | None) -> None:
    """compute=gpu renders the GPU worker group: it must be there, with GPUs."""
    if group is None:
        raise KeyedError(
            "worker_groups.gpu",
            "is needed with compute=gpu (the GPU worker group is rendered then)",
        )
    if group.gpu < 1:
        raise KeyedError(
            "worker_groups.gpu.gpu",
            f"must be >= 1 for the GPU group with compute=gpu; got {group.gpu!r}",
        )
