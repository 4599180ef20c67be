"""backend=vm with backend.cluster_yaml: the user's cluster YAML as rayflow writes it for `ray up`.

`render_file` = the file (vm.user_file: loaded and checked) + rayflow's keys that the user set +
what a submitted run needs + backend.overrides, checked again as Ray would; with the notes a dry
run prints about it. Precedence, lowest first: the file; rayflow's keys whose value differs from
the packaged default (conf/backend/vm.yaml: a key set to exactly its default does not override
the file); backend.overrides, merged last. What a run needs is added idempotently (rendering
the written document again gives the same document): the token file mounted as
~/.ray/auth_token, `export RAY_AUTH_MODE=...;` before every `ray start`, the head's
--dashboard-host as the rendered path decides it, and where the file has no setup_commands of
its own, rayflow's dependencies pinned to this machine's versions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.vm import internals, providers, user_file
from rayflow.backends.vm.commands import dashboard_host, private_token_setup
from rayflow.backends.vm.config import launcher_env
from rayflow.backends.vm.defaults import with_defaults
from rayflow.backends.vm.providers import Provider
from rayflow.backends.vm.rules import shipped_defaults
from rayflow.schema.values import merge_overrides

TOKEN_MOUNT = "~/.ray/auth_token"
# rayflow's keys that apply on top of a file, and the file's key each one sets.
TOP_LEVEL = {
    "cluster_name": ("cluster_name", str),
    "max_worker_nodes": ("max_workers", int),
    "autoscale_upscaling_speed": ("upscaling_speed", float),
    "autoscale_idle_timeout_minutes": ("idle_timeout_minutes", float),
}
_AUTH_EXPORT = re.compile(r"^\s*export RAY_AUTH_MODE=[^;\s]*;\s*")
_DASHBOARD_HOST = re.compile(r"--dashboard-host[= ]\S+")


def set_by_user(b: Mapping) -> set[str]:
    """rayflow's keys whose value differs from the packaged default: those the user set."""
    shipped = shipped_defaults()
    return {key for key, value in b.items() if key in shipped and value != shipped[key]}


def _gpus(node_type: Any) -> float:
    resources = node_type.get("resources") if isinstance(node_type, Mapping) else None
    value = (resources or {}).get("GPU", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def node_types(doc: Mapping, gpu: bool, path: str) -> dict[str, str]:
    """The node types a run uses: the first worker type without GPUs ("cpu") and, with
    compute=gpu, the first with GPUs ("gpu"; the head's where no worker type has any)."""
    types = doc.get("available_node_types")
    if not isinstance(types, Mapping) or not types:
        return {}  # local: the hosts are the one node type (Ray detects their GPUs)
    head = doc.get("head_node_type")
    workers = [name for name in types if name != head]
    chosen = {}
    cpu = [name for name in workers if not _gpus(types[name])]
    if cpu:
        chosen["cpu"] = cpu[0]
    if gpu:
        with_gpus = [name for name in workers if _gpus(types[name])] or [
            name for name in types if _gpus(types[name])
        ]
        if not with_gpus:
            raise user_file.refuse(
                path,
                "available_node_types",
                "no node type has GPUs in its resources, and compute=gpu needs one "
                "(declare `resources: {GPU: N}` on a worker type)",
            )
        chosen["gpu"] = with_gpus[0]
    return chosen


def _start_commands(doc: dict, kind: str, b: Mapping, auth_mode: str, path: str) -> None:
    """Every `ray start` after `export RAY_AUTH_MODE=<mode>;`, the head's --dashboard-host set."""
    host = dashboard_host(b, auth_mode)
    defaults = None
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        if key not in doc:  # Ray's provider defaults would be used: rayflow adds to those
            defaults = defaults or _ray_defaults(kind)
            doc[key] = list(defaults.get(key) or [])
        commands = []
        for command in doc[key] or []:
            if isinstance(command, str) and "ray start" in command:
                command = f"export RAY_AUTH_MODE={auth_mode}; " + _AUTH_EXPORT.sub("", command)
                if key == "head_start_ray_commands" and "--head" in command:
                    command = (
                        _DASHBOARD_HOST.sub(f"--dashboard-host={host}", command)
                        if _DASHBOARD_HOST.search(command)
                        else f"{command} --dashboard-host={host}"
                    )
            commands.append(command)
        doc[key] = commands
    if not any(
        isinstance(c, str) and "ray start" in c and "--head" in c
        for c in doc["head_start_ray_commands"]
    ):
        raise user_file.refuse(
            path,
            "head_start_ray_commands",
            "has no `ray start --head`: rayflow submits the run to the head's dashboard",
        )


def _ray_defaults(kind: str) -> dict:
    return internals.provider_defaults(kind)


def _setup(doc: dict, raw: Mapping, provider: Provider, ray_version: str) -> str | None:
    """rayflow's pinned setup where the file has none of its own; else a note on what it must
    provide."""
    if provider.in_place:
        return None  # the nodes are processes of this machine's venv
    ours = provider.setup_commands(ray_version)["setup_commands"]
    if "setup_commands" not in raw:
        doc["setup_commands"] = ours
        return None
    if ours[-1] in (raw.get("setup_commands") or []):
        return None  # rayflow's own (a dry run's output, fed back)
    need = (
        f"ray {ray_version} on the hosts (rayflow checks, never installs, on hosts you run)"
        if provider.hosts
        else f'"ray[default,tune]=={ray_version}" '
        "and rayflow's runtime dependencies at this machine's versions "
        f"(rayflow.runtime.requirements.runtime_requirements)"
    )
    return (
        "rayflow: backend.cluster_yaml: the file's own setup_commands are kept, "
        f"not rayflow's pins: they must install {need}"
    )


def _apply_users_keys(
    doc: dict, b: Mapping, user: set[str], provider: Provider, gpu: bool, path: str
) -> dict[str, str]:
    """rayflow's keys the user set, over the file's; returns the node types the run uses."""
    for key, (target, kind_of) in TOP_LEVEL.items():
        if key in user:
            doc[target] = kind_of(b[key])
    chosen = node_types(doc, gpu, path)
    if "min_worker_nodes" in user:
        if provider.hosts:
            # Ray moves it onto the hosts' node type
            doc["min_workers"] = int(b["min_worker_nodes"])
        elif chosen.get("gpu" if gpu else "cpu"):
            doc["available_node_types"][chosen["gpu" if gpu else "cpu"]]["min_workers"] = int(
                b["min_worker_nodes"]
            )
        else:
            raise user_file.refuse(
                path,
                "available_node_types",
                "names no worker node type for backend.min_worker_nodes to apply to",
            )
    # a dry run masks the key's path: it may come back this way
    for key in ("ssh_user", "ssh_private_key"):
        if key in user:
            doc.setdefault("auth", {})[key] = b[key]
    return chosen


def _add_run_needs(
    doc: dict,
    b: Mapping,
    provider: Provider,
    auth_mode: str,
    token_file: str | None,
    gcs_address: str | None,
    path: str,
) -> None:
    """What a submitted run needs of the nodes: the token file mounted, every `ray start` set up
    (_start_commands); for fake_multinode, where the head's GCS listens."""
    if provider.in_place:
        if gcs_address:
            doc["provider"]["gcs_address"] = gcs_address
        return
    mounts = doc.get("file_mounts")
    if not isinstance(mounts, dict):
        mounts = {}
    if auth_mode == "token" and token_file:
        doc["file_mounts"] = {**mounts, TOKEN_MOUNT: str(token_file)}
    _start_commands(doc, provider.name, b, auth_mode, path)


def _add_metadata(
    doc: dict,
    provider: Provider,
    versions: tuple[str, str],
    env: dict[str, str],
    chosen: dict[str, str],
) -> None:
    """`metadata.rayflow`, beside the file's own metadata (Ray keeps metadata, never reads it)."""
    ray_version, python_version = versions
    kept = doc.get("metadata")
    if not isinstance(kept, Mapping):
        kept = {}
    doc["metadata"] = {
        **kept,
        "rayflow": {
            "provider": provider.name,
            "ray_version": ray_version,
            "python_version": python_version,
            "autoscaler": provider.autoscaler,
            "launcher_env": env,
            "node_types": chosen,
            "placeholders": [],
        },
    }


def _added(
    b: Mapping,
    raw: Mapping,
    provider: Provider,
    auth_mode: str,
    token_file: str | None,
    ray_version: str,
) -> list[str]:
    """What rayflow adds to the file, as the dry run's note says it."""
    added = []
    if not provider.in_place:
        if auth_mode == "token":
            added.append(
                (
                    f"the token file mounted as {TOKEN_MOUNT}"
                    if token_file
                    else "the token file mounted as ~/.ray/auth_token (at start)"
                )
                + " and made private on every node (first of setup_commands)"
            )
        added += [
            f"`export RAY_AUTH_MODE={auth_mode};` before every `ray start`",
            f"--dashboard-host={dashboard_host(b, auth_mode)} on the head",
        ]
    if "setup_commands" not in raw and not provider.in_place:
        added.append(
            f"setup_commands pinning ray {ray_version} "
            f"({'checked' if provider.hosts else 'with its runtime dependencies'})"
        )
    return added


def render_file(
    section: DictConfig | Mapping,
    gpu: bool,
    auth_mode: str,
    ray_version: str,
    python_version: str,
    token_file: str | None = None,
    gcs_address: str | None = None,
) -> tuple[dict, list[str]]:
    """The document rayflow writes for `ray up` (fake_multinode: for `ray start --head
    --autoscaling-config`) from backend.cluster_yaml, and the notes a dry run prints."""
    b = with_defaults(section)
    path = str(b["cluster_yaml"])
    raw = user_file.load(path)
    kind = user_file.check_raw(raw, path)
    provider = providers.get(kind)
    doc, user = copy.deepcopy(raw), set_by_user(b)

    chosen = _apply_users_keys(doc, b, user, provider, gpu, path)
    _add_run_needs(doc, b, provider, auth_mode, token_file, gcs_address, path)
    setup_note = _setup(doc, raw, provider, ray_version)
    env = launcher_env(b, auth_mode, token_file, provider=kind)
    _add_metadata(doc, provider, (ray_version, python_version), env, chosen)
    doc = private_token_setup(merge_overrides(doc, b.get("overrides") or {}))
    # what `ray up` fills in from the cloud's API, filled here too (gcp: Ray fills only a TPU
    # pod's head resource, at start; a GCP file states its own)
    fill_note = provider.fill_resources(doc, path)
    user_file.check_final(doc, path, kind)

    added = _added(b, raw, provider, auth_mode, token_file, ray_version)
    applied = [
        f"backend.{k}"
        for k in sorted(user & {*TOP_LEVEL, "min_worker_nodes", "ssh_user", "ssh_private_key"})
    ]
    notes = [
        f"rayflow: backend.cluster_yaml {path}: "
        f"rayflow adds {'; '.join(added) if added else 'nothing'}"
        + (f"; over the file: {', '.join(applied)}" if applied else "")
        + ("; then backend.overrides" if b.get("overrides") else "")
    ]
    if setup_note:
        notes.append(setup_note)
    if fill_note:
        notes.append(fill_note)
    if gpu and "gpu" in chosen:
        notes.append(f"rayflow: compute=gpu: the run uses the file's node type {chosen['gpu']!r}")
    return doc, notes
