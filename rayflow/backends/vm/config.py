"""backend=vm, offline half: the `backend:` section -> the cluster YAML of Ray's cluster launcher.

Pure functions, nothing started: `render` builds the cluster config (`ray up` for
local/aws/gcp; the autoscaling config of `RAY_FAKE_CLUSTER=1 ray start --head
--autoscaling-config=FILE` for fake_multinode), its provider's part from its provider
(rayflow.backends.vm.providers); `validate` runs Ray's own checks on it. Ray is imported inside
functions only.

`check`, `placeholders`, `placeholder_note` and `require_filled` (vm.checks) refuse bad keys and
name what only the user can fill in. What the launcher needs besides the file (environment,
head `ray start` arguments) comes from `launcher_env` (here) and `head_start_args`
(vm.commands), and is noted in the rendered config under `metadata.rayflow` (Ray keeps `metadata`
and never reads it). Modules: defaults <- commands <- providers <- checks <- config <- cluster
(no cycle).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from rayflow.backends.vm import internals, providers
from rayflow.backends.vm.checks import placeholders
from rayflow.backends.vm.commands import private_token_setup
from rayflow.backends.vm.defaults import WORKER_TYPES, with_defaults
from rayflow.backends.vm.rules import rendered_kinds
from rayflow.errors import ConfigError
from rayflow.runtime.requirements import installed_version
from rayflow.schema.values import merge_overrides

# --- render -----------------------------------------------------------------------------------


def launcher_env(
    section: DictConfig | Mapping,
    auth_mode: str,
    token_file: str | None = None,
    provider: str | None = None,
) -> dict[str, str]:
    """Environment for the process that starts the cluster (`ray up`, or `ray start --head`
    for fake_multinode), on top of this process's own. provider: the cluster's, where a user's
    cluster YAML (backend.cluster_yaml) names it rather than the section."""
    kind = provider or with_defaults(section)["provider"]
    return providers.get(kind).launcher_env(auth_mode, token_file)


def _files(in_place: bool, auth_mode: str, token_file: str | None) -> dict[str, Any]:
    """The file settings: only the token's file is mounted, by its path."""
    mounts = {}
    # in place: one machine, one file
    if auth_mode == "token" and token_file and not in_place:
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


def _metadata(
    b: dict,
    kinds: Any,
    auth_mode: str,
    versions: tuple[str, str],
    token_file: str | None,
) -> dict[str, Any]:
    """`metadata.rayflow`: what the launcher needs besides the file (Ray never reads it)."""
    provider = providers.get(b["provider"])
    ray_version, python_version = versions
    return {
        "rayflow": {
            "provider": provider.name,
            "ray_version": ray_version,
            "python_version": python_version,  # the launcher's; cloud images bring their own Python
            "autoscaler": provider.autoscaler,
            "launcher_env": provider.launcher_env(auth_mode, token_file),
            "node_types": {kind: WORKER_TYPES[kind] for kind in kinds}
            if not provider.hosts
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
    provider = providers.get(b["provider"])
    ray_version = ray_version or installed_version("ray")
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    kinds = rendered_kinds(gpu)

    config: dict[str, Any] = {
        "cluster_name": str(b["cluster_name"]),
        "max_workers": int(b["max_worker_nodes"]),
    }
    if provider.hosts:  # Ray moves it onto the hosts' node type
        config["min_workers"] = int(b["min_worker_nodes"])
    config["upscaling_speed"] = float(b["autoscale_upscaling_speed"])
    config["idle_timeout_minutes"] = float(b["autoscale_idle_timeout_minutes"])
    config.update(provider.render(b, gpu, gcs_address))
    config.update(_files(provider.in_place, auth_mode, token_file))
    config.update(provider.setup_commands(ray_version))
    config.update(provider.start_commands(b, gpu, auth_mode))
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
            in_place = provider is not None and providers.get(provider).in_place
            prepared = plain if in_place else internals.prepare_config(plain)
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
