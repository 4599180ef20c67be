"""backend=kuberay backend.manifest=PATH: what rayflow puts on top of the user's manifest.

Precedence, lowest first: the manifest as written < the rayflow keys the user set <
backend.overrides (deep-merged last, a null deletes). A key counts as set when its value differs
from the packaged default (conf/backend/kuberay.yaml): Hydra cannot tell `max_worker_nodes=2`
typed on the command line from the default 2, so a key set to its default value leaves the
manifest's field alone (documented in docs/backends/kuberay.md). Always added, each in a note:
the labels (app.kubernetes.io/managed-by: rayflow; rayflow.io/run at start), metadata.namespace
where the manifest has none, token auth (authOptions.mode: token) where the manifest configures
no auth and ray_auth_mode=token. Kubernetes token auth (enableK8sTokenAuth, KubeRay 1.6+ with
Ray >= 2.55) is kept, and rayflow then authenticates with the user's Kubernetes credentials. A
RayJob is run in InteractiveMode (rayflow submits the run and writes its id into spec.jobId): the
fields of KubeRay's own submitter are dropped, in a note.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from rayflow.backends.kuberay import manifest as km
from rayflow.backends.kuberay.user_manifest import UserManifest, refuse
from rayflow.schema.values import merge_overrides

# Keys that become manifest fields when set; the others of the section steer rayflow itself.
ON_TOP = (
    "cluster_name",
    "namespace",
    "mode",
    "image",
    "ray_version",
    "service_type",
    "enable_in_tree_autoscaling",
    "autoscaler_version",
    "min_worker_nodes",
    "max_worker_nodes",
    "autoscale_idle_timeout_minutes",
    "autoscale_upscaling_speed",
    "upscaling_mode",
    "autoscaler",
    "rayjob",
)
# the manifest describes its pods; refused when set
PODS_IN_THE_MANIFEST = ("head", "worker_groups")
SUBMITTER_FIELDS = (
    "entrypoint",
    "runtimeEnvYAML",
    "entrypointNumCpus",
    "entrypointNumGpus",
    "entrypointResources",
    "submitterPodTemplate",
    "submitterConfig",
    "backoffLimit",
)


@functools.cache
def packaged_defaults() -> dict:
    return yaml.safe_load(
        (resources.files("rayflow.conf") / "backend" / "kuberay.yaml").read_text()
    )


def set_keys(b: Mapping) -> dict[str, Any]:
    """{dotted key: value} of the keys that differ from the packaged default (leaves; a whole
    mapping where the default has none, such as a worker group a user added)."""
    out: dict[str, Any] = {}

    def walk(value: Any, default: Any, path: str) -> None:
        if isinstance(value, Mapping) and isinstance(default, Mapping):
            for key in value:
                walk(value[key], default.get(key, _MISSING), f"{path}.{key}" if path else str(key))
        elif default is _MISSING or value != default:
            out[path] = value

    defaults = packaged_defaults()
    for key in (*ON_TOP, *PODS_IN_THE_MANIFEST):
        if key in b:
            walk(b[key], defaults.get(key, _MISSING), key)
    return out


_MISSING = object()


def gpu_group(group: Mapping) -> bool:
    """A worker group whose pods request nvidia.com/gpu (limits, requests, or the group's
    resources)."""
    containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
    wanted = [group.get("resources") or {}]
    for container in containers:
        amounts = container.get("resources") or {}
        wanted += [amounts.get("limits") or {}, amounts.get("requests") or {}]
    return any(km.GPU_RESOURCE in w and str(w[km.GPU_RESOURCE]) not in ("0", "") for w in wanted)


def run_group(manifest: Mapping, gpu: bool) -> dict | None:
    """The worker group the run uses: the first requesting GPUs with compute=gpu, else the first
    without (else the first at all); None when the manifest has no worker group."""
    groups = km.cluster_of(manifest).get("workerGroupSpecs") or []
    matching = [g for g in groups if gpu_group(g) == gpu]
    return (matching or ([] if gpu else groups) or [None])[0]


def auth_of(cluster: Mapping) -> dict | None:
    """How the manifest configures Ray's auth: {"mode", "secret", "key", "k8s"}; None: not at all.
    `secret`/`key`: where the token is (KubeRay's generated Secret, or the head's
    RAY_AUTH_TOKEN)."""
    options = cluster.get("authOptions") or {}
    head = (((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}).get(
        "containers"
    ) or [{}]
    env = {e.get("name"): e for e in head[0].get("env") or [] if isinstance(e, dict)}
    k8s = (
        bool(options.get("enableK8sTokenAuth"))
        or str((env.get("RAY_ENABLE_K8S_TOKEN_AUTH") or {}).get("value")).lower() == "true"
    )
    if options.get("mode"):
        return {
            "mode": options["mode"],
            "secret": options.get("secretName"),
            "key": "auth_token",
            "k8s": k8s,
        }
    if "RAY_AUTH_MODE" in env:
        ref = ((env.get("RAY_AUTH_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
        return {
            "mode": env["RAY_AUTH_MODE"].get("value") or "",
            "secret": ref.get("name"),
            "key": ref.get("key") or "auth_token",
            "k8s": k8s,
            "env": True,
        }
    return None


def _refuse_pod_keys(keys: Mapping, path: str) -> None:
    for key in keys:
        if key.split(".")[0] in PODS_IN_THE_MANIFEST:
            raise refuse(
                path,
                f"backend.{key} is set, but with backend.manifest the pods are the manifest's: "
                "write it in the file, or use backend.overrides",
            )


def _name_and_namespace(meta: dict, keys: Mapping, b: Mapping, path: str, what: str) -> list[str]:
    """metadata.name (backend.cluster_name where set or where the manifest has none: rayflow
    deletes what it applied by name) and metadata.namespace; the notes on what changed."""
    notes = []
    if "cluster_name" in keys or not meta.get("name"):
        if meta.pop("generateName", None):  # rayflow deletes what it applied by name
            notes.append(
                "backend.manifest: metadata.generateName dropped: rayflow names the object "
                "(backend.cluster_name)"
            )
        notes.append(
            f"backend.manifest: metadata.name {meta.get('name') or '(none)'} -> "
            f"{b['cluster_name']} (backend.cluster_name)"
        )
        meta["name"] = str(b["cluster_name"])
    if meta.get("namespace"):
        if "namespace" in keys and keys["namespace"] != meta["namespace"]:
            raise refuse(
                path,
                f"{what} is in namespace {meta['namespace']}, but "
                f"backend.namespace={keys['namespace']}: drop one of them",
            )
    else:
        meta["namespace"] = str(b["namespace"])
        notes.append(
            f"backend.manifest: metadata.namespace {meta['namespace']} added (backend.namespace)"
        )
    return notes


def _auth_notes(m: dict, cluster: dict, auth_mode: str) -> list[str]:
    """Token auth added where the manifest configures none and ray_auth_mode=token; the notes on
    the auth the manifest keeps."""
    notes = []
    auth = auth_of(cluster)
    if auth is not None and auth["k8s"]:
        notes.append(
            "backend.manifest: Kubernetes token auth (enableK8sTokenAuth): rayflow authenticates "
            "to the dashboard with your Kubernetes credentials (the kubeconfig's bearer token), "
            "which need RBAC verb ray:write on rayclusters"
        )
    if auth is None and auth_mode == "token":
        cluster["authOptions"] = {"mode": "token"}
        where = "spec.rayClusterSpec" if m["kind"] == "RayJob" else "spec"
        notes.append(
            f"backend.manifest: {where}.authOptions {{mode: token}} added (ray_auth_mode=token; "
            "KubeRay keeps the token in a Secret)"
        )
    elif auth is not None and auth["mode"] != "token":
        notes.append(
            f"backend.manifest: the manifest sets Ray's auth mode {auth['mode']!r}: kept as it "
            "is, whatever ray_auth_mode says"
        )
    return notes


def render(
    user: UserManifest, b: Mapping, gpu: bool, auth_mode: str, labels: Mapping
) -> tuple[dict, list[str]]:
    """The object rayflow applies for `user`'s manifest and the section `b`, and a note for each
    thing rayflow changed or added. ConfigError (backend.manifest, or the key) for what cannot
    be."""
    m, notes, path, what = copy.deepcopy(user.document), list(user.notes), user.path, user.what
    keys = set_keys(b)
    _refuse_pod_keys(keys, path)
    meta = m.setdefault("metadata", {})
    m.setdefault("spec", {})
    if m["kind"] == "RayJob":
        notes += _interactive(m, path, what)
    if "mode" in keys and (keys["mode"] == "rayjob") != (m["kind"] == "RayJob"):
        raise refuse(
            path,
            f"backend.mode={keys['mode']}, but the manifest is {what}: the manifest's kind "
            "decides (drop backend.mode)",
        )
    notes += _name_and_namespace(meta, keys, b, path, what)
    cluster = km.cluster_of(m)
    assert isinstance(cluster, dict)  # plain data, changed in place: the spec m holds
    notes += _keys_on_top(m, cluster, keys, b, gpu, path)
    if gpu and run_group(m, True) is None:
        raise refuse(
            path,
            f"compute=gpu, but no worker group of {what} requests {km.GPU_RESOURCE} (limits or "
            "requests)",
        )
    added = {**km.MANAGED_BY, **{str(k): str(v) for k, v in labels.items()}}
    meta["labels"] = {**(meta.get("labels") or {}), **added}
    notes.append(
        f"backend.manifest: labels {', '.join(f'{k}={v}' for k, v in km.MANAGED_BY.items())} and "
        "rayflow.io/run=<run id> added"
    )
    notes += _auth_notes(m, cluster, auth_mode)
    overrides = b.get("overrides") or {}
    if overrides:
        notes.append("backend.manifest: backend.overrides merged last")
    return merge_overrides(m, overrides), notes


def _interactive(m: dict, path: str, what: str) -> list[str]:
    spec = m.setdefault("spec", {})
    if spec.get("clusterSelector") or not spec.get("rayClusterSpec"):
        raise refuse(
            path,
            f"{what} has no spec.rayClusterSpec (it runs on an existing RayCluster): to run "
            "there, use backend.cluster_name=<that RayCluster> backend.keep_cluster=true without "
            "backend.manifest",
        )
    dropped = [f for f in SUBMITTER_FIELDS if f in spec]
    for field in dropped:
        del spec[field]
    mode = spec.get("submissionMode") or "K8sJobMode"
    spec["submissionMode"] = "InteractiveMode"
    if mode == "InteractiveMode" and not dropped:
        return []
    return [
        f"backend.manifest: spec.submissionMode {mode} -> InteractiveMode: rayflow submits the "
        "run itself" + (f" (dropped: {', '.join('spec.' + f for f in dropped)})" if dropped else "")
    ]


def _put(notes: list[str], node: dict, field: str, value: Any, key: str, where: str) -> None:
    """Set a manifest field from a rayflow key, with the note that says so."""
    node[field] = value
    notes.append(f"backend.manifest: {where} = {value!r} (backend.{key})")


def _cluster_fields(cluster: dict, keys: Mapping, b: Mapping, notes: list[str]) -> None:
    if "ray_version" in keys:
        _put(notes, cluster, "rayVersion", str(b["ray_version"]), "ray_version", "spec.rayVersion")
    if "service_type" in keys:
        _put(
            notes,
            cluster.setdefault("headGroupSpec", {}),
            "serviceType",
            str(b["service_type"]),
            "service_type",
            "headGroupSpec.serviceType",
        )
    if "image" in keys:  # containers[0] is the Ray container to the operator
        for group in [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]:
            containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or []
            if containers:
                _put(
                    notes,
                    containers[0],
                    "image",
                    str(b["image"]),
                    "image",
                    f"{group.get('groupName', 'head')} containers[0].image",
                )
    if "enable_in_tree_autoscaling" in keys:
        _put(
            notes,
            cluster,
            "enableInTreeAutoscaling",
            bool(b["enable_in_tree_autoscaling"]),
            "enable_in_tree_autoscaling",
            "spec.enableInTreeAutoscaling",
        )


def _autoscaler_fields(cluster: dict, keys: Mapping, b: Mapping, notes: list[str]) -> None:
    options = cluster.get("autoscalerOptions") or {}
    for key, field, value in (
        ("autoscaler_version", "version", lambda: str(b["autoscaler_version"])),
        (
            "autoscale_idle_timeout_minutes",
            "idleTimeoutSeconds",
            lambda: round(float(b["autoscale_idle_timeout_minutes"]) * 60),
        ),
        ("autoscale_upscaling_speed", "upscalingMode", lambda: km.upscaling_mode(b)),
        ("upscaling_mode", "upscalingMode", lambda: km.upscaling_mode(b)),
    ):
        if key in keys:
            _put(notes, options, field, value(), key, f"autoscalerOptions.{field}")
    if any(k.startswith("autoscaler.") for k in keys):
        _put(
            notes,
            options,
            "resources",
            km.autoscaler_options(b)["resources"],
            "autoscaler",
            "autoscalerOptions.resources",
        )
    if options:
        cluster["autoscalerOptions"] = options


def _replica_bounds(
    m: dict, keys: Mapping, b: Mapping, gpu: bool, path: str, notes: list[str]
) -> None:
    """backend.min/max_worker_nodes on the run's worker group, its replicas kept within them."""
    bounds = [k for k in ("min_worker_nodes", "max_worker_nodes") if k in keys]
    if not bounds:
        return
    group = run_group(m, gpu)
    if group is None:
        raise refuse(
            path,
            f"backend.{bounds[0]} is set, but the manifest has no worker group to apply it to",
        )
    name = group.get("groupName")
    if "min_worker_nodes" in keys:
        _put(
            notes,
            group,
            "minReplicas",
            int(b["min_worker_nodes"]),
            "min_worker_nodes",
            f"workerGroupSpecs[{name}].minReplicas",
        )
    if "max_worker_nodes" in keys:
        _put(
            notes,
            group,
            "maxReplicas",
            int(b["max_worker_nodes"]),
            "max_worker_nodes",
            f"workerGroupSpecs[{name}].maxReplicas",
        )
    replicas, high = group.get("replicas"), group.get("maxReplicas")
    if replicas is not None:  # within the new bounds (rayflow renders replicas = min)
        group["replicas"] = max(
            int(group.get("minReplicas") or 0),
            min(int(replicas), int(replicas if high is None else high)),
        )


def _rayjob_fields(m: dict, keys: Mapping, b: Mapping, path: str, notes: list[str]) -> None:
    if m["kind"] != "RayJob":
        if any(k.startswith("rayjob.") for k in keys):
            raise refuse(
                path,
                "backend.rayjob.* is set, but the manifest is "
                f"{m['kind']}/{m['metadata'].get('name')}, not a RayJob",
            )
        return
    for key, field in (
        ("shutdown_after_job_finishes", "shutdownAfterJobFinishes"),
        ("ttl_seconds_after_finished", "ttlSecondsAfterFinished"),
        ("active_deadline_seconds", "activeDeadlineSeconds"),
        ("pre_running_deadline_seconds", "preRunningDeadlineSeconds"),
    ):
        if f"rayjob.{key}" in keys:
            value = b["rayjob"][key]
            _put(
                notes,
                m["spec"],
                field,
                value if value is None or isinstance(value, bool) else int(value),
                f"rayjob.{key}",
                f"spec.{field}",
            )


def _keys_on_top(
    m: dict, cluster: dict, keys: Mapping, b: Mapping, gpu: bool, path: str
) -> list[str]:
    """The rayflow keys the user set, put on the manifest's fields; a note for each."""
    notes: list[str] = []
    _cluster_fields(cluster, keys, b, notes)
    _autoscaler_fields(cluster, keys, b, notes)
    _replica_bounds(m, keys, b, gpu, path, notes)
    _rayjob_fields(m, keys, b, path, notes)
    return notes


__all__ = ["auth_of", "gpu_group", "render", "run_group", "set_keys"]
