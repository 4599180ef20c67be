"""backend=kuberay, offline half: the `backend:` section -> a KubeRay RayCluster or RayJob.

Pure functions, nothing applied and no `kubernetes` import: `render` builds the manifest
(kuberay_resources reads back the Ray resources its pods will have), `autoscaling_table` is
the one mapping of the autoscaling vocabulary rayflow shares with backend=spark and
backend=vm (backends/kuberay/README.md prints the same rows).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from rayflow.backends.kuberay.keys import image_ray_version, replica_bounds
from rayflow.schema.values import merge_overrides

API_VERSION = "ray.io/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rayflow"}
HEAD_CONTAINER, WORKER_CONTAINER = "ray-head", "ray-worker"
# A Ray that fails to start writes no termination message: the kubelet then keeps the last lines
# of its log in the container's status, which rayflow's fail-fast line quotes (wait.py) and
# which needs no right to read pod logs.
LAST_WORDS = {"terminationMessagePolicy": "FallbackToLogsOnError"}
# KubeRay builds the head service's ports from the head container's named ports.
HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001))
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
IMAGE_REPOSITORY = "rayproject/ray"

# --- the autoscaling vocabulary ----------------------------------------------------------------


class AutoscalingRow(NamedTuple):
    key: str  # backend.<key>, the same name in conf/backend/{spark,vm,kuberay}.yaml
    spark: str  # ray.util.spark.setup_ray_cluster's argument
    vm: str  # Ray's cluster YAML
    kuberay: str  # the RayCluster field
    ray: str  # what Ray's autoscaler, underneath all three, runs with (its units)


AUTOSCALING = (
    AutoscalingRow(
        "min_worker_nodes",
        "min_worker_nodes",
        "min_workers of the node type the run uses",
        "workerGroupSpecs[].minReplicas of the group the run uses",
        "min_workers of a node type (nodes)",
    ),
    AutoscalingRow(
        "max_worker_nodes",
        "max_worker_nodes",
        "max_workers",
        "workerGroupSpecs[].maxReplicas",
        "max_workers (nodes)",
    ),
    AutoscalingRow(
        "autoscale_idle_timeout_minutes",
        "autoscale_idle_timeout_minutes",
        "idle_timeout_minutes",
        "autoscalerOptions.idleTimeoutSeconds (x 60, rounded)",
        "idle_timeout_minutes (minutes)",
    ),
    AutoscalingRow(
        "autoscale_upscaling_speed",
        "autoscale_upscaling_speed",
        "upscaling_speed",
        "autoscalerOptions.upscalingMode (<= 1: Conservative, > 1: Default)",
        "upscaling_speed (nodes added at once, a multiple of those running)",
    ),
    AutoscalingRow(
        "upscaling_mode",
        "-",
        "-",
        "autoscalerOptions.upscalingMode (set: wins over the speed)",
        "upscaling_speed 1 (Conservative) or 1000 (Default, Aggressive)",
    ),
    AutoscalingRow(
        "enable_in_tree_autoscaling",
        "- (on when min < max)",
        "- (always on)",
        "enableInTreeAutoscaling",
        "the autoscaler runs (KubeRay: a sidecar of the head pod)",
    ),
    AutoscalingRow(
        "autoscaler_version",
        "-",
        "- (v2 on clouds, v1 local)",
        "autoscalerOptions.version",
        "autoscaler v1 or v2",
    ),
)


def autoscaling_table() -> list[tuple[str, str, str, str, str]]:
    """The rows (rayflow key, spark, vm, kuberay, Ray's autoscaler): the table of
    docs/backends/index.md, kept equal by a test."""
    return [(row.key, row.spark, row.vm, row.kuberay, row.ray) for row in AUTOSCALING]


def upscaling_mode(b: Mapping) -> str:
    """upscaling_mode, else from the speed. Ray's KubeRay autoscaler reads the mode back as a
    speed (ray/autoscaler/_private/kuberay/autoscaling_config.py,
    _derive_autoscaling_config_from_ray_cr): Conservative -> 1, Default and Aggressive -> 1000."""
    if b.get("upscaling_mode"):
        return str(b["upscaling_mode"])
    return "Conservative" if float(b["autoscale_upscaling_speed"]) <= 1 else "Default"


def autoscaler_options(b: Mapping) -> dict:
    """spec.autoscalerOptions: the one place the shared vocabulary becomes KubeRay's."""
    return {
        "version": str(
            b["autoscaler_version"]
        ),  # explicit: the operator's default changes across releases
        "idleTimeoutSeconds": round(float(b["autoscale_idle_timeout_minutes"]) * 60),
        "upscalingMode": upscaling_mode(b),
        "resources": _resources(b["autoscaler"]["cpu"], b["autoscaler"]["memory"]),
    }


# --- the section -------------------------------------------------------------------------------


def plain(section: DictConfig | Mapping) -> dict:
    if isinstance(section, DictConfig):
        container = OmegaConf.to_container(section, resolve=True)
        assert isinstance(container, dict)  # the container of a DictConfig
        return container
    return copy.deepcopy(dict(section))


def group_names(b: Mapping, gpu: bool) -> list[str]:
    """The worker groups rendered: cpu, gpu with compute=gpu, and any a user added."""
    return [name for name in (b.get("worker_groups") or {}) if name != "gpu" or gpu]


def ray_version_of(b: Mapping, installed: str) -> str:
    """rayVersion: backend.ray_version, else the explicit image's tag, else the installed Ray."""
    return str(b.get("ray_version") or image_ray_version(b.get("image")) or installed)


def image_for(b: Mapping, ray_version: str, python_version: str, gpu_group: bool) -> str:
    if b.get("image"):
        return str(b["image"])
    python = python_version.replace(".", "")
    return f"{IMAGE_REPOSITORY}:{ray_version}-py{python}{'-gpu' if gpu_group else ''}"


# --- render ------------------------------------------------------------------------------------


def _resources(cpu: Any, memory: Any, gpus: Any = 0) -> dict:
    """requests = limits (Guaranteed QoS: Ray's scheduling assumes the pod keeps what it asked
    for)."""
    amounts = {"cpu": str(cpu), "memory": str(memory)}
    limits = dict(amounts, **({GPU_RESOURCE: str(gpus)} if gpus and float(gpus) > 0 else {}))
    return {"requests": amounts, "limits": limits}


def _pod_spec(container: dict, node_selector: Mapping, tolerations: list, v2: bool) -> dict:
    spec: dict[str, Any] = {"containers": [container]}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    if v2:  # the v2 autoscaler replaces failed pods itself: KubeRay requires Never (or unset)
        spec["restartPolicy"] = "Never"
    return spec


def cluster_spec(
    b: Mapping, gpu: bool, auth_mode: str, ray_version: str, python_version: str
) -> dict:
    autoscaling = bool(b["enable_in_tree_autoscaling"])
    v2 = autoscaling and b["autoscaler_version"] == "v2"
    head = b["head"]
    head_container = {
        "name": HEAD_CONTAINER,
        "image": image_for(b, ray_version, python_version, False),
        "ports": [{"containerPort": port, "name": name} for name, port in HEAD_PORTS],
        "resources": _resources(head["cpu"], head["memory"]),
        **LAST_WORDS,
    }
    spec: dict[str, Any] = {"rayVersion": ray_version, "enableInTreeAutoscaling": autoscaling}
    if autoscaling:
        spec["autoscalerOptions"] = autoscaler_options(b)
    if auth_mode == "token":  # the operator makes the Secret and sets RAY_AUTH_MODE/RAY_AUTH_TOKEN
        spec["authOptions"] = {"mode": "token"}
    spec["headGroupSpec"] = {
        "serviceType": str(b["service_type"]),
        "rayStartParams": {"num-cpus": str(head["num_cpus"])},  # rayStartParams values are strings
        "template": {
            "spec": _pod_spec(
                head_container, head.get("node_selector") or {}, head.get("tolerations") or [], v2
            )
        },
    }
    workers = []
    for name in group_names(b, gpu):
        group = b["worker_groups"][name]
        gpus = group.get("gpu") or 0
        container = {
            "name": WORKER_CONTAINER,
            "image": image_for(b, ray_version, python_version, float(gpus) > 0),
            "resources": _resources(group["cpu"], group["memory"], gpus),
            **LAST_WORDS,
        }
        tolerations = list(group.get("tolerations") or [])
        if float(gpus) > 0 and GPU_TOLERATION not in tolerations:
            tolerations.append(dict(GPU_TOLERATION))
        replicas, low, high = replica_bounds(b, name, gpu)
        workers.append(
            {
                "groupName": name,
                "replicas": replicas,
                "minReplicas": low,
                "maxReplicas": high,
                "template": {
                    "spec": _pod_spec(container, group.get("node_selector") or {}, tolerations, v2)
                },
            }
        )
    spec["workerGroupSpecs"] = workers
    return spec


def render(
    section: DictConfig | Mapping,
    gpu: bool,
    auth_mode: str,
    ray_version: str,
    python_version: str,
    labels: Mapping,
) -> dict:
    """The RayCluster (mode=cluster) or RayJob (mode=rayjob) for a `backend:` section, with
    backend.overrides deep-merged last. ray_version: the installed Ray (used when neither
    backend.ray_version nor an explicit image's tag says otherwise)."""
    b = plain(section)
    version = ray_version_of(b, ray_version)
    metadata = {
        "name": str(b["cluster_name"]),
        "namespace": str(b["namespace"]),
        "labels": {**MANAGED_BY, **{str(k): str(v) for k, v in labels.items()}},
    }
    spec = cluster_spec(b, gpu, auth_mode, version, python_version)
    if b["mode"] == "rayjob":
        lifecycle = b.get("rayjob") or {}
        # InteractiveMode: the operator starts the cluster and waits; rayflow submits the job
        # itself, then writes its id into spec.jobId for the operator to follow.
        job: dict[str, Any] = {
            "submissionMode": "InteractiveMode",
            "shutdownAfterJobFinishes": bool(lifecycle.get("shutdown_after_job_finishes")),
        }
        for key, field in (
            ("ttl_seconds_after_finished", "ttlSecondsAfterFinished"),
            ("active_deadline_seconds", "activeDeadlineSeconds"),
            ("pre_running_deadline_seconds", "preRunningDeadlineSeconds"),
        ):
            if lifecycle.get(key) is not None:
                job[field] = int(lifecycle[key])
        manifest = {
            "apiVersion": API_VERSION,
            "kind": "RayJob",
            "metadata": metadata,
            "spec": {**job, "rayClusterSpec": spec},
        }
    else:
        manifest = {
            "apiVersion": API_VERSION,
            "kind": "RayCluster",
            "metadata": metadata,
            "spec": spec,
        }
    return merge_overrides(manifest, b.get("overrides") or {})


# --- reading a manifest ------------------------------------------------------------------------


def cluster_of(manifest: Mapping) -> Mapping:
    spec = manifest.get("spec") or {}
    return (spec.get("rayClusterSpec") or {}) if manifest.get("kind") == "RayJob" else spec


def literal_secrets(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, variable) of each `env` item anywhere in the manifest whose name says it is secret
    (rayflow.security.secret_names.is_secret_name) and whose value is written in it: the object
    stored in the API server would hold it in clear for anyone who may read it. valueFrom items
    are fine."""
    from rayflow.security.secret_names import is_secret_name

    out: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, child in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "env" and isinstance(child, list):
                out += [
                    (f"{where}[{item['name']}]", str(item["name"]))
                    for item in child
                    if isinstance(item, Mapping)
                    and isinstance(item.get("name"), str)
                    and is_secret_name(item["name"])
                    and item.get("value") not in (None, "")
                ]
            out += literal_secrets(child, where)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            name = (
                child.get("name") or child.get("groupName") if isinstance(child, Mapping) else None
            )
            out += literal_secrets(child, f"{path}[{name if isinstance(name, str) else index}]")
    return out


def secret_notes(manifest: Mapping) -> list[str]:
    """One warning per literal secret of literal_secrets, naming the Kubernetes Secret
    alternative."""
    kind, meta = manifest.get("kind"), manifest.get("metadata") or {}
    return [
        f"warning: {where}: {name} is a literal value in the {kind} (masked in rayflow's output, "
        f"but stored in clear in the object, readable by whoever may read {kind}s in namespace "
        f"{meta.get('namespace')}): keep it in a Kubernetes Secret (kubectl create secret generic "
        f"NAME --from-literal={name}=...) and refer to it with valueFrom.secretKeyRef in place of "
        "value"
        for where, name in literal_secrets(manifest)
    ]
