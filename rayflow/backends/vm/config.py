"""backend=vm, offline half: the `backend:` section -> the cluster YAML of Ray's cluster launcher.

Pure functions, nothing started: `render` builds the cluster config (`ray up` for
local/aws/gcp; the autoscaling config of `RAY_FAKE_CLUSTER=1 ray start --head
--autoscaling-config=FILE` for fake_multinode), `validate` runs Ray's own checks on it. Ray is
imported inside functions only.

`check`, `placeholders`, `placeholder_note` and `require_filled` (vm.checks) refuse bad keys and
name what only the user can fill in. What the launcher needs besides the file (environment,
head `ray start` arguments) comes from `launcher_env` and `head_start_args` (vm.commands), and is
noted in the rendered config under `metadata.rayflow` (Ray keeps `metadata` and never reads it).
Modules: defaults <- checks, commands <- config <- cluster (no cycle).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.vm import internals
from rayflow.backends.vm.checks import (
    placeholders,
)
from rayflow.backends.vm.commands import (
    launcher_env,
    private_token_setup,
    setup_commands,
    start_commands,
)
from rayflow.backends.vm.defaults import (
    DEFAULT_GCP_ACCELERATOR,
    DEFAULT_INSTANCE,
    FAKE_HEAD_TYPE,
    GCP_DISK_GB,
    GCP_IMAGE,
    HEAD_TYPE,
    WORKER_TYPES,
    gcp_zone,
    placeholder,
    with_defaults,
)
from rayflow.backends.vm.rules import cloud_region, node_type_bounds, rendered_kinds
from rayflow.errors import ConfigError
from rayflow.runtime.requirements import installed_version
from rayflow.schema.values import merge_overrides

# --- render -----------------------------------------------------------------------------------


def _resources(t: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    if t.get("num_cpus") is not None:
        out["CPU"] = int(t["num_cpus"])
    if t.get("num_gpus") is not None:
        out["GPU"] = int(t["num_gpus"])
    if t.get("memory") is not None:
        out["memory"] = int(t["memory"])
    if t.get("object_store_memory") is not None:
        out["object_store_memory"] = int(t["object_store_memory"])
    return out


def _node_config(b: dict, kind: str) -> dict:
    """The provider's launch settings for the head ("head") or a worker type ("cpu", "gpu")."""
    provider = b["provider"]
    t = b["worker"].get(kind, {}) if kind != "head" else {}
    instance = (
        b.get("head_instance_type") if kind == "head" else t.get("instance_type")
    ) or DEFAULT_INSTANCE.get(provider, {}).get(kind)
    if provider == "aws":
        config: dict[str, Any] = {"InstanceType": instance}
        if b.get("ami"):
            # else Ray's Deep Learning AMI for the region (NVIDIA drivers included)
            config["ImageId"] = b["ami"]
        if t.get("spot"):  # EC2 reclaims it with two minutes' notice
            config["InstanceMarketOptions"] = {"MarketType": "spot"}
        return config
    if provider == "gcp":
        image = b.get("source_image") or GCP_IMAGE["gpu" if kind == "gpu" else "cpu"]
        config = {
            "machineType": instance,
            "disks": [
                {
                    "boot": True,
                    "autoDelete": True,
                    "type": "PERSISTENT",
                    "initializeParams": {"diskSizeGb": GCP_DISK_GB, "sourceImage": image},
                }
            ],
        }
        if t.get("spot"):  # Spot VMs: deleted when reclaimed, never left stopped (billing disks)
            config["scheduling"] = {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
            }
        if kind == "gpu":
            config["guestAccelerators"] = [
                {
                    "acceleratorType": t.get("accelerator_type") or DEFAULT_GCP_ACCELERATOR,
                    "acceleratorCount": int(t["num_gpus"]),
                }
            ]
            # GPU VMs cannot live-migrate
            config.setdefault("scheduling", {})["onHostMaintenance"] = "TERMINATE"
            config["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
        return config
    return {}


def _provider(b: dict, provider: str, gcs_address: str | None) -> dict[str, Any]:
    """The config's `provider:` section."""
    if provider == "fake_multinode":
        section: dict[str, Any] = {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        }
        if gcs_address:
            section["gcs_address"] = gcs_address
        return section
    if provider == "local":
        return {
            "type": "local",
            "head_ip": b.get("head_ip") or placeholder("head_ip"),
            "worker_ips": list(b.get("worker_ips") or [placeholder("worker_ips")]),
        }
    section = {"type": provider, "region": cloud_region(b)}
    if provider == "aws" and b.get("availability_zone"):
        section["availability_zone"] = str(b["availability_zone"])
    if provider == "gcp":
        section["availability_zone"] = gcp_zone(b) or placeholder("availability_zone")
        section["project_id"] = b.get("project_id") or placeholder("project_id")
    # Stopped instances keep their disks, and the disks keep billing: terminate unless asked.
    section["cache_stopped_nodes"] = bool(b["cache_stopped_nodes"])
    return section


def _auth(b: dict, provider: str) -> dict[str, Any]:
    """The config's `auth:` section: how `ray up` reaches the nodes over SSH."""
    if provider == "fake_multinode":
        return {}
    if provider == "local":
        return {
            "ssh_user": b.get("ssh_user") or placeholder("ssh_user"),
            "ssh_private_key": b.get("ssh_private_key") or placeholder("ssh_private_key"),
        }
    auth = {"ssh_user": b.get("ssh_user") or "ubuntu"}
    if b.get("ssh_private_key"):
        auth["ssh_private_key"] = str(b["ssh_private_key"])
    return auth


def _node_types(b: dict, provider: str, gpu: bool, kinds: Any) -> dict[str, Any]:
    """`available_node_types` (the head and each worker kind rendered) and `head_node_type`."""
    head_type = FAKE_HEAD_TYPE if provider == "fake_multinode" else HEAD_TYPE
    head = {
        "resources": {"CPU": int(b["num_cpus_head_node"]), "GPU": int(b["num_gpus_head_node"])},
        "node_config": _node_config(b, "head"),
        "min_workers": 0,
        "max_workers": 0,
    }
    types = {head_type: head}
    for kind in kinds:
        low, high = node_type_bounds(b, kind, gpu)
        types[WORKER_TYPES[kind]] = {
            "resources": _resources(b["worker"][kind]),
            "node_config": _node_config(b, kind),
            "min_workers": low,
            "max_workers": high,
        }
    return {"available_node_types": types, "head_node_type": head_type}


def _files(provider: str, auth_mode: str, token_file: str | None) -> dict[str, Any]:
    """The file settings: only the token's file is mounted, by its path."""
    mounts = {}
    # fake: one machine, one file
    if auth_mode == "token" and token_file and provider != "fake_multinode":
        mounts["~/.ray/auth_token"] = str(token_file)
    return {
        "file_mounts": mounts,
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "docker": {},
        "initialization_commands": [],
    }


def _ray_commands(b: dict, provider: str, gpu: bool, auth_mode: str) -> dict[str, list[str]]:
    """The `ray start` commands of the head and the workers."""
    if provider == "fake_multinode":  # the launcher starts the head; the provider starts workers
        return {"head_start_ray_commands": [], "worker_start_ray_commands": []}
    head, workers = start_commands(b, gpu, auth_mode)
    return {"head_start_ray_commands": head, "worker_start_ray_commands": workers}


def _metadata(
    b: dict,
    kinds: Any,
    auth_mode: str,
    versions: tuple[str, str],
    token_file: str | None,
) -> dict[str, Any]:
    """`metadata.rayflow`: what the launcher needs besides the file (Ray never reads it)."""
    provider = b["provider"]
    ray_version, python_version = versions
    return {
        "rayflow": {
            "provider": provider,
            "ray_version": ray_version,
            "python_version": python_version,  # the launcher's; cloud images bring their own Python
            "autoscaler": "v1" if provider in ("local", "fake_multinode") else "v2",
            "launcher_env": launcher_env(b, auth_mode, token_file),
            "node_types": {kind: WORKER_TYPES[kind] for kind in kinds}
            if provider != "local"
            else {},
            "placeholders": placeholders(b),
        }
    }


def render(
    section: DictConfig | Mapping,
    gpu: bool,
    auth_mode: str,
    ray_version: str | None = None,
    python_version: str | None = None,
    token_file: str | None = None,
    gcs_address: str | None = None,
) -> dict:
    """The cluster config for Ray's cluster launcher, as plain data (`yaml.safe_dump` it).

    gpu: the run uses GPUs (compute=gpu): the GPU worker type is rendered too. auth_mode:
    `token` or `disabled`, exported before every `ray start`. token_file: with token auth,
    mounted on every node as ~/.ray/auth_token (its path only; the token never enters the
    config). gcs_address: fake_multinode only, where the head's GCS listens when not on this
    machine's address at port 6379. Keys only the user can fill in render as `<fill in: ...>`.
    """
    b = with_defaults(section)
    provider = b["provider"]
    ray_version = ray_version or installed_version("ray")
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    kinds = rendered_kinds(gpu)

    config: dict[str, Any] = {
        "cluster_name": str(b["cluster_name"]),
        "max_workers": int(b["max_worker_nodes"]),
    }
    if provider == "local":
        config["min_workers"] = int(b["min_worker_nodes"])  # Ray moves it onto the local node type
    config["upscaling_speed"] = float(b["autoscale_upscaling_speed"])
    config["idle_timeout_minutes"] = float(b["autoscale_idle_timeout_minutes"])
    config["provider"] = _provider(b, provider, gcs_address)
    config["auth"] = _auth(b, provider)
    if provider != "local":  # Ray refuses node types for local: the hosts are its one type
        config.update(_node_types(b, provider, gpu, kinds))
    config.update(_files(provider, auth_mode, token_file))
    config.update(setup_commands(b, ray_version))
    config.update(_ray_commands(b, provider, gpu, auth_mode))
    config["metadata"] = _metadata(b, kinds, auth_mode, (ray_version, python_version), token_file)
    return private_token_setup(merge_overrides(config, b.get("overrides") or {}))


# --- Ray's validation -----------------------------------------------------------------------


def validate(config: Mapping) -> None:
    """Ray's own checks of a rendered config: `prepare_config` (its provider's defaults
    merged in, as `ray up` does) then `validate_config` (ray-schema.json and the node type
    rules). fake_multinode: `validate_config` on the config as written, which is what its
    autoscaler reads; Ray's prepare_config for it needs an example.yaml the wheel lacks.
    Raises ConfigError("backend", Ray's message on one line)."""
    import contextlib
    import io

    import click
    import jsonschema

    plain: dict[str, Any] = copy.deepcopy(dict(config))
    provider = (
        (plain.get("provider") or {}).get("type")
        if isinstance(plain.get("provider"), Mapping)
        else None
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            prepared = plain if provider == "fake_multinode" else internals.prepare_config(plain)
            internals.validate_config(prepared)
    # Ray's refusals: the schema's, its node-type rules' (ValueError), an unknown provider
    # (NotImplementedError) or out-of-date defaults (RuntimeError), its launcher's abort (click).
    except (jsonschema.ValidationError, ValueError, RuntimeError, click.ClickException) as err:
        raise ConfigError(
            "backend", f"Ray refuses the rendered cluster config: {_ray_message(err)}"
        ) from None


def _ray_message(err: Exception) -> str:
    message = getattr(err, "message", None) or str(err) or type(err).__name__
    path = getattr(err, "absolute_path", None)
    where = ".".join(str(p) for p in path) if path else ""
    text = " ".join(str(message).split())
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{where}: {text}" if where else text
