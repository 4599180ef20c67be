"""backend=kuberay: the checks of the `backend:` section, before anything is applied.

`check` holds the section to its schema (rayflow.backends.kuberay.keys: every key's kind and the
rules between keys), then renders the manifest and holds it to KubeRay's CRD schema
(kuberay_schema.schema_errors) and to the operator's own rules (`operator_errors`, mirroring
ray-operator/controllers/ray/utils/validation.go of KubeRay v1.7.0), which is where what
backend.overrides adds is checked: a rule the manifest only breaks because of backend.overrides
is reported as backend.overrides. Pure functions: no Kubernetes cluster, no credentials.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.kuberay import manifest as km
from rayflow.backends.kuberay import user_layers, user_manifest
from rayflow.backends.kuberay.keys import DNS_1035, MAX_NAME, Kuberay, image_ray_version
from rayflow.errors import ConfigError
from rayflow.schema import validate_section
from rayflow.security.auth import refuse_auth_off

TOKEN_AUTH_MIN_RAY = (2, 52, 0)  # ValidateRayClusterSpec: authOptions.mode token needs Ray 2.52.0
# Ray delegates token checks to Kubernetes (TokenReview) from 2.55.0
K8S_TOKEN_AUTH_MIN_RAY = (2, 55, 0)
START_RESOURCE_PARAMS = ("num-cpus", "num-gpus", "memory", "resources")
K8S_AUTH_NEEDS_PROXY = (
    "is service, but the cluster uses Kubernetes token auth (enableK8sTokenAuth), where your "
    "Kubernetes token is Ray's: rayflow sends it only to the API server it came from (the service "
    "proxy), never straight to a dashboard; set backend.dashboard_access=proxy (or auto)"
)


def _version(text: Any) -> tuple[int, ...] | None:
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""))
    return tuple(int(p or 0) for p in match.groups()) if match else None


def _check_token_auth(b: dict, auth_mode: str, installed_ray: str) -> None:
    """Token auth needs Ray 2.52.0 on the cluster: the version from backend.ray_version, the
    image's tag, else the Ray installed here (which is why this is not the schema's)."""
    version = km.ray_version_of(b, installed_ray)
    if auth_mode == "token" and (_version(version) or (0,)) < TOKEN_AUTH_MIN_RAY:
        key = (
            "backend.ray_version"
            if b.get("ray_version") is not None
            else "backend.image"
            if image_ray_version(b.get("image"))
            else "ray_auth_mode"
        )
        raise ConfigError(
            key,
            f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {version} (use "
            "Ray >= 2.52.0: token auth is always on, ray_auth_mode=disabled is refused)",
        )


# --- auth off beside a head reachable from outside the cluster ---------------------------------

EXPOSING_SERVICE_TYPES = ("NodePort", "LoadBalancer")


def exposures(manifest: Mapping) -> list[tuple[str, str]]:
    """(manifest path, what) for each way the head's dashboard and client ports reach beyond the
    cluster's own network: a NodePort or LoadBalancer head service (serviceType, or headService's
    own spec.type), an Ingress (enableIngress), the node's network (hostNetwork) or a hostPort."""
    cluster = km.cluster_of(manifest)
    base = (
        "spec.rayClusterSpec.headGroupSpec"
        if manifest.get("kind") == "RayJob"
        else "spec.headGroupSpec"
    )
    head = cluster.get("headGroupSpec") or {}
    out = []
    if head.get("serviceType") in EXPOSING_SERVICE_TYPES:
        out.append((f"{base}.serviceType", f"a head service of type {head['serviceType']}"))
    own_type = ((head.get("headService") or {}).get("spec") or {}).get("type")
    if own_type in EXPOSING_SERVICE_TYPES:
        out.append((f"{base}.headService.spec.type", f"a head service of type {own_type}"))
    if head.get("enableIngress"):
        out.append((f"{base}.enableIngress", "an Ingress to the head's dashboard"))
    pod = (head.get("template") or {}).get("spec") or {}
    if pod.get("hostNetwork"):
        out.append(
            (
                f"{base}.template.spec.hostNetwork",
                "the head pod on its node's network (hostNetwork)",
            )
        )
    for container in pod.get("containers") or []:
        for port in container.get("ports") or []:
            if isinstance(port, dict) and port.get("hostPort"):
                out.append(
                    (
                        f"{base}.template.spec.containers[{container.get('name')}].ports[{port.get('name')}].hostPort",
                        f"the head's port {port.get('containerPort')} on its node's address "
                        f"(hostPort {port['hostPort']})",
                    )
                )
    return out


def effective_auth(manifest: Mapping) -> str:
    """The Ray auth mode the cluster runs with: token when the manifest configures it, else
    disabled."""
    auth = user_layers.auth_of(km.cluster_of(manifest))
    return "token" if auth is not None and auth["mode"] == "token" else "disabled"


def refuse_bad_k8s_auth(
    manifest: Mapping, key: str, ray_version: str | None = None, dashboard_access: Any = "auto"
) -> None:
    """Kubernetes token auth (authOptions.enableK8sTokenAuth or RAY_ENABLE_K8S_TOKEN_AUTH): Ray's
    token auth must be on (mode token) and the cluster's Ray >= 2.55.0, else no client gets in;
    and the dashboard is reached through the API server (the user's Kubernetes token is Ray's)."""
    auth = user_layers.auth_of(km.cluster_of(manifest))
    if auth is None or not auth["k8s"]:
        return
    if auth["mode"] != "token":
        raise ConfigError(
            key,
            "Kubernetes token auth (enableK8sTokenAuth) needs Ray's token auth on "
            f"(authOptions.mode: token), got mode {auth['mode']!r}",
        )
    version = km.cluster_of(manifest).get("rayVersion") or ray_version
    if (_version(version) or (0,)) < K8S_TOKEN_AUTH_MIN_RAY:
        raise ConfigError(
            key,
            "Kubernetes token auth (enableK8sTokenAuth) needs Ray >= 2.55.0 on the cluster, got "
            f"{version or 'no rayVersion'}",
        )
    if dashboard_access == "service":
        raise ConfigError("backend.dashboard_access", K8S_AUTH_NEEDS_PROXY)


LISTENING = (
    "with backend=kuberay the head's GCS, dashboard and Ray Client listen on the pod network, "
    "which every pod of the Kubernetes cluster reaches (through a ClusterIP service too)"
)


def refuse_exposed_auth_off(
    manifest: Mapping, without_overrides: Mapping, auth_mode: str, source: str
) -> None:
    """Ray's token auth off on the cluster, from ray_auth_mode=disabled, backend.overrides or
    the manifest (`source`, the key of what rayflow renders from: backend or backend.manifest):
    refused in one line naming ray_auth_mode (rayflow.security.auth.refuse_auth_off), saying
    what else puts the head beyond the cluster's network. A ClusterIP head is refused too: every
    pod of the cluster reaches it."""
    if effective_auth(manifest) == "token":
        return
    exposed = "; ".join(f"{what} ({path})" for path, what in exposures(manifest))
    listening = LISTENING + (f", and {exposed} puts them beyond the cluster" if exposed else "")
    if auth_mode == "disabled":
        refuse_auth_off(auth_mode, listening)
    elif effective_auth(without_overrides) == "token":
        refuse_auth_off("disabled", listening, "backend.overrides turns it off")
    refuse_auth_off("disabled", listening, f"{source} turns it off")


# --- the operator's rules on a rendered manifest -----------------------------------------------


def _metadata_findings(kind: Any, name: str) -> list[tuple[str, str]]:
    """ValidateRayClusterMetadata, ValidateRayJobMetadata."""
    if kind not in MAX_NAME:
        return []
    if len(name) > MAX_NAME[kind]:
        return [
            ("metadata.name", f"{kind} name should be no more than {MAX_NAME[kind]} characters")
        ]
    if not DNS_1035.fullmatch(name):
        return [("metadata.name", f"{kind} name should be a valid DNS1035 label")]
    return []


def _rayjob_findings(spec: Mapping) -> list[tuple[str, str]]:
    """ValidateRayJobSpec, validateDeletionConfiguration."""
    out: list[tuple[str, str]] = []
    ttl = spec.get("ttlSecondsAfterFinished") or 0
    if ttl < 0:
        out.append(
            (
                "spec.ttlSecondsAfterFinished",
                "TTLSecondsAfterFinished must be a non-negative integer",
            )
        )
    if not spec.get("shutdownAfterJobFinishes") and ttl > 0:
        out.append(
            (
                "spec.ttlSecondsAfterFinished",
                "a RayJob with shutdownAfterJobFinishes set to false cannot have "
                "TTLSecondsAfterFinished",
            )
        )
    for field in ("activeDeadlineSeconds", "preRunningDeadlineSeconds"):
        if spec.get(field) is not None and spec[field] <= 0:
            out.append((f"spec.{field}", f"{field} must be a positive integer"))
    if spec.get("submissionMode") == "InteractiveMode" and (spec.get("backoffLimit") or 0) > 0:
        out.append(("spec.backoffLimit", "BackoffLimit is incompatible with InteractiveMode"))
    return out


def _group_findings(
    group_name: Any, path: str, group: Mapping, autoscaling: bool, v2: bool
) -> list[tuple[str, str]]:
    """ValidateRayClusterSpec's rules for every group, the head's included."""
    out: list[tuple[str, str]] = []
    params = group.get("rayStartParams") or {}
    given = any(params.get(p) not in (None, "") for p in START_RESOURCE_PARAMS)
    if given and group.get("resources"):  # validateRayGroupResources
        out.append(
            (
                f"{path}.resources",
                "resource fields should not be set in both rayStartParams and Resources for "
                f"{group_name} group; please use only one",
            )
        )
    if "labels" in params:  # validateRayGroupLabels
        out.append(
            (
                f"{path}.rayStartParams.labels",
                f"rayStartParams['labels'] is not supported for {group_name} group; please "
                "use the top-level Labels field instead",
            )
        )
    policy = ((group.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if autoscaling and v2 and policy not in (None, "", "Never"):
        who = "head Pod" if group_name == "Head" else f"worker group {group_name}"
        out.append(
            (
                f"{path}.template.spec.restartPolicy",
                f"restartPolicy for {who} should be Never or unset when using autoscaler V2",
            )
        )
    return out


def _worker_group_findings(
    group_name: Any, path: str, group: Mapping, autoscaling: bool, v2_env: bool
) -> list[tuple[str, str]]:
    """ValidateRayClusterSpec's rules for a worker group: its replicas and idle timeout.
    v2_env: autoscaler v2 is on (autoscalerOptions.version, or the head's environment)."""
    out: list[tuple[str, str]] = []
    low, high = group.get("minReplicas"), group.get("maxReplicas")
    if not autoscaling and (low is None or high is None):
        out.append(
            (
                f"{path}.minReplicas",
                f"worker group {group_name} must set both minReplicas and maxReplicas when "
                "autoscaling is disabled",
            )
        )
    for field, value in (("minReplicas", low), ("maxReplicas", high)):
        if value is not None and value < 0:
            out.append(
                (f"{path}.{field}", f"worker group {group_name} has negative {field} {value}")
            )
    if low is not None and high is not None and low > high:
        out.append(
            (
                f"{path}.minReplicas",
                f"worker group {group_name} has minReplicas {low} greater than maxReplicas {high}",
            )
        )
    if group.get("idleTimeoutSeconds") is not None and not v2_env:  # validateWorkerGroupIdleTimeout
        out.append(
            (
                f"{path}.idleTimeoutSeconds",
                f"worker group {group_name}: idleTimeoutSeconds is set, but autoscaler v2 is "
                "not enabled",
            )
        )
    return out


def _autoscaler_findings(
    base: str, cluster: Mapping, autoscaling: bool, head_env: list[Any]
) -> list[tuple[str, str]]:
    """ValidateRayClusterSpec's rules on autoscalerOptions."""
    out: list[tuple[str, str]] = []
    options = cluster.get("autoscalerOptions") or {}
    if autoscaling and options.get("version") and "RAY_enable_autoscaler_v2" in head_env:
        out.append(
            (
                f"{base}.autoscalerOptions.version",
                "both .spec.autoscalerOptions.version and head Pod env var "
                "RAY_enable_autoscaler_v2 are set, please only use the former",
            )
        )
    if (options.get("idleTimeoutSeconds") or 0) < 0:
        out.append(
            (
                f"{base}.autoscalerOptions.idleTimeoutSeconds",
                "autoscalerOptions.idleTimeoutSeconds must be non-negative, got "
                f"{options['idleTimeoutSeconds']}",
            )
        )
    return out


def _token_auth_findings(
    base: str, cluster: Mapping, ray_version: str | None
) -> list[tuple[str, str]]:
    """ValidateRayClusterSpec, IsAuthEnabled: token auth needs a known Ray >= 2.52.0."""
    if (cluster.get("authOptions") or {}).get("mode") != "token":
        return []
    version = cluster.get("rayVersion") or ray_version
    parsed = _version(version)
    if not version:
        message = (
            "authOptions.mode is 'token' but RayVersion was not specified. Ray version "
            "2.52.0 or later is required"
        )
    elif parsed is None:
        message = f"authOptions.mode is 'token' but RayVersion format is invalid: {version}"
    elif parsed < TOKEN_AUTH_MIN_RAY:
        message = f"authOptions.mode is 'token' but minimum Ray version is 2.52.0, got {version}"
    else:
        return []
    return [(f"{base}.rayVersion", message)]


def _findings(manifest: Mapping, ray_version: str | None = None) -> list[tuple[str, str]]:
    """(manifest path, message) for each rule of KubeRay's validation.go the manifest breaks, in
    the order the operator checks them."""
    kind = manifest.get("kind")
    name = str((manifest.get("metadata") or {}).get("name", ""))
    out = _metadata_findings(kind, name)
    spec = manifest.get("spec") or {}
    base = "spec.rayClusterSpec" if kind == "RayJob" else "spec"
    if kind == "RayJob":
        out += _rayjob_findings(spec)
    cluster = km.cluster_of(manifest)
    autoscaling = bool(cluster.get("enableInTreeAutoscaling"))
    v2 = (cluster.get("autoscalerOptions") or {}).get("version") == "v2"  # IsAutoscalingV2Enabled
    head = cluster.get("headGroupSpec") or {}
    head_env = [
        e.get("name")
        for c in ((head.get("template") or {}).get("spec") or {}).get("containers", [])[:1]
        for e in c.get("env") or []
    ]
    groups = [("Head", f"{base}.headGroupSpec", head)]
    groups += [
        (g.get("groupName"), f"{base}.workerGroupSpecs[{g.get('groupName')}]", g)
        for g in cluster.get("workerGroupSpecs") or []
    ]
    v2_env = v2 or "RAY_enable_autoscaler_v2" in head_env
    for group_name, path, group in groups:  # ValidateRayClusterSpec, per group
        out += _group_findings(group_name, path, group, autoscaling, v2)
        if group_name != "Head":
            out += _worker_group_findings(group_name, path, group, autoscaling, v2_env)
    out += _autoscaler_findings(base, cluster, autoscaling, head_env)
    out += _token_auth_findings(base, cluster, ray_version)
    return out


def config_key(path: str) -> str | None:
    """The `backend:` key rayflow renders a manifest path from, or None."""
    path = path.replace("spec.rayClusterSpec.", "spec.")
    group = re.fullmatch(r"spec\.workerGroupSpecs\[([^\]]+)\]\.(minReplicas|maxReplicas)", path)
    if group:
        key = "min_replicas" if group.group(2) == "minReplicas" else "max_replicas"
        return f"backend.worker_groups.{group.group(1)}.{key}"
    return {
        "metadata.name": "backend.cluster_name",
        "spec.rayVersion": "backend.ray_version",
        "spec.autoscalerOptions.idleTimeoutSeconds": "backend.autoscale_idle_timeout_minutes",
        "spec.ttlSecondsAfterFinished": "backend.rayjob.ttl_seconds_after_finished",
        "spec.activeDeadlineSeconds": "backend.rayjob.active_deadline_seconds",
        "spec.preRunningDeadlineSeconds": "backend.rayjob.pre_running_deadline_seconds",
    }.get(path)


def operator_errors(manifest: Mapping, ray_version: str | None = None) -> list[tuple[str, str]]:
    """(where, message) for each rule of the KubeRay operator the manifest breaks: where is the
    `backend:` key the field is rendered from, else the manifest path (message: "<path>: ...").
    ray_version: the rayVersion to assume where the manifest gives none."""
    return [
        (config_key(path) or path, f"{path}: {message}")
        for path, message in _findings(manifest, ray_version)
    ]


def check(
    section: DictConfig | Mapping, gpu: bool, auth_mode: str, ray_version: str, python_version: str
) -> None:
    """Raise ConfigError naming the key for a bad `backend:` section of backend=kuberay."""
    b = km.plain(section)
    # the schema's rules read the device from the section
    if gpu != (b.get("compute_device") == "cuda"):
        b["compute_device"] = "cuda" if gpu else "cpu"
    validate_section("backend", Kuberay, b, {"ray_auth_mode": auth_mode})
    _check_token_auth(b, auth_mode, ray_version)
    manifest = km.render(b, gpu, auth_mode, ray_version, python_version, {})
    rendered = km.render({**b, "overrides": {}}, gpu, auth_mode, ray_version, python_version, {})
    refuse_exposed_auth_off(manifest, rendered, auth_mode, "backend")  # first: ray_auth_mode
    # first: the rules below assume the types
    for where, line in _schema_errors(manifest, rendered):
        raise ConfigError(where, f"{line} (KubeRay's CRD schema)")
    own = set(_findings(rendered, ray_version))
    for path, message in _findings(manifest, ray_version):
        key = (config_key(path) or "backend") if (path, message) in own else "backend.overrides"
        raise ConfigError(key, f"{path}: {message} (the KubeRay operator refuses it)")
    refuse_bad_k8s_auth(manifest, "backend.overrides", ray_version, b.get("dashboard_access"))


def _schema_errors(manifest: Mapping, rendered: Mapping) -> list[tuple[str, str]]:
    """("backend" | "backend.overrides", "path: message") for each error of KubeRay's CRD schema:
    an error the manifest without overrides lacks comes from backend.overrides."""
    try:
        from rayflow.backends.kuberay.crd import schema_errors
    # the schema module lands separately; nothing else is skipped
    except ModuleNotFoundError as err:
        if err.name != "rayflow.backends.kuberay.crd":
            raise
        return []
    own = set(schema_errors(rendered))
    return [
        ("backend" if line in own else "backend.overrides", line)
        for line in schema_errors(manifest)
    ]


def check_user_manifest(section: DictConfig | Mapping, gpu: bool, auth_mode: str) -> None:
    """backend.manifest=PATH: the section's keys, then the file (kuberay.user_manifest), then what
    rayflow applies (kuberay.user_layers) against KubeRay's CRD schema and the operator's rules.
    ConfigError of backend.manifest naming the file, the object and the field; of
    backend.overrides when only the overrides bring the error in."""
    from rayflow.backends.kuberay.crd import schema_errors, with_defaults

    b = km.plain(section)
    if gpu != (b.get("compute_device") == "cuda"):
        b["compute_device"] = "cuda" if gpu else "cpu"
    validate_section("backend", Kuberay, b, {"ray_auth_mode": auth_mode})
    user = user_manifest.read(b["manifest"])
    manifest, _ = user_layers.render(user, b, gpu, auth_mode, {})
    plain, _ = user_layers.render(
        user_manifest.read(b["manifest"]), {**b, "overrides": {}}, gpu, auth_mode, {}
    )
    refuse_exposed_auth_off(manifest, plain, auth_mode, f"backend.manifest {user.path}")
    what = user_manifest.describe(manifest)
    own = set(schema_errors(plain))
    for line in schema_errors(manifest):
        raise ConfigError(
            "backend.manifest" if line in own else "backend.overrides",
            f"{user.path}: {what}: {line} (KubeRay's CRD schema)",
        )
    # The operator reads the object as stored: the CRD's defaults applied (an unset maxReplicas
    # is 2147483647), and rayVersion as written (it assumes none).
    own_findings = set(_findings(with_defaults(plain)))
    added_token = user_layers.auth_of(km.cluster_of(user.document)) is None and auth_mode == "token"
    for path, message in _findings(with_defaults(manifest)):
        hint = (
            " (rayflow adds token auth where the manifest configures none: a rayVersion >= "
            "2.52.0; auth off is refused)"
            if added_token and "authOptions.mode is 'token'" in message
            else ""
        )
        key = "backend.manifest" if (path, message) in own_findings else "backend.overrides"
        raise ConfigError(
            key, f"{user.path}: {what}: {path}: {message} (the KubeRay operator refuses it){hint}"
        )
    refuse_bad_k8s_auth(manifest, "backend.manifest", dashboard_access=b.get("dashboard_access"))
