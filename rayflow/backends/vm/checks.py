"""backend=vm: the checks of the `backend:` section, before anything starts.

`check` holds the section to its schema (rayflow.backends.vm.keys: every key's kind; vm.rules: the
rules between keys, keys of outdated guides named with what replaced them; vm.providers: the
provider's own) and then to what `ray up` needs on this machine; `placeholders` lists what only
the user can fill in (the provider says what), `placeholder_note` is the line a dry run prints
about them, and `require_filled` refuses them before a real start. Nothing started, no cloud
credentials read.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

from omegaconf import DictConfig

from rayflow.backends.vm import providers
from rayflow.backends.vm.defaults import plain_section, with_defaults
from rayflow.backends.vm.keys import Vm
from rayflow.backends.vm.rules import cluster_name_problem
from rayflow.errors import ConfigError
from rayflow.schema import validate_section
from rayflow.security.auth import NO_LOOPBACK, NODE_SERVERS, refuse_auth_off


def check(section: DictConfig | Mapping, gpu: bool, auth_mode: str = "token") -> None:
    """Raise ConfigError naming the key for a bad `backend:` section of backend=vm.

    Starts nothing and reads no cloud credentials; for the providers `ray up` starts (local,
    aws, gcp) it looks for `ssh` and `rsync` on PATH and checks that a given SSH key file can
    be read. Placeholders pass (a dry run renders them); `require_filled` refuses them before
    a real start. gpu: the run uses GPUs (the GPU node type is rendered); auth_mode: the run's
    ray_auth_mode (`disabled` is refused: rayflow.security.auth.refuse_auth_off)."""
    raw = plain_section(section)
    # first: whatever else is wrong, auth off is (check_exposure: what the document turns off)
    refuse_auth_off(auth_mode, listening(None if raw.get("cluster_yaml") else raw.get("provider")))
    # the schema's rules read the device from the section
    if gpu != (raw.get("compute_device") == "cuda"):
        raw["compute_device"] = "cuda" if gpu else "cpu"
    validate_section("backend", Vm, raw, {"ray_auth_mode": auth_mode})
    b = with_defaults(raw)
    key_file = b.get("ssh_private_key")
    if key_file is not None:  # also with backend.cluster_yaml, whose auth it then sets
        path = os.path.expanduser(key_file)
        # The path itself stays out of the message: secret-named keys are masked everywhere.
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(
                "backend.ssh_private_key",
                "cannot be read: no such file, not a file, or no permission to read it",
            )
    if b.get("cluster_yaml") is None:  # a file's provider: VMCluster.check, once it is read
        provider = providers.get(b["provider"])
        if not provider.in_place:
            check_tools(provider.name)
        provider.check_here(b)


def check_tools(provider: str, key: str = "backend.provider") -> None:
    """What `ray up` needs on this machine: it reaches every node with ssh and syncs files
    (its own config on the head, the token) with rsync."""
    for tool, package in (("ssh", "openssh-client"), ("rsync", "rsync")):
        if shutil.which(tool) is None:
            raise ConfigError(
                key,
                f"provider={provider} runs `{tool}` from this machine (ray up), "
                f"and it is not on PATH: apt-get install {package}",
            )


# --- placeholders ---------------------------------------------------------------------------


def placeholders(section: DictConfig | Mapping) -> list[str]:
    """The keys only the user can fill in that are still unset (`backend.project_id`, ...),
    in the order they should be filled in."""
    b = with_defaults(section)
    return providers.get(b.get("provider", "")).placeholders(b)


def placeholder_note(section: DictConfig | Mapping) -> str | None:
    """The one line a dry run prints when placeholders are left, or None."""
    keys = placeholders(section)
    if not keys:
        return None
    return (
        f"rayflow: dry run: fill in {', '.join(keys)} before a real start "
        "(the printed config shows <fill in: ...> there)"
    )


def require_filled(section: DictConfig | Mapping) -> None:
    """Refuse a real start while a placeholder is left: ConfigError naming the first key."""
    keys = placeholders(section)
    if keys:
        provider = with_defaults(section).get("provider")
        raise ConfigError(
            keys[0],
            f"must be filled in before provider={provider} can start "
            f"(see backends/vm/{provider}.yaml); still unset: {', '.join(keys)}",
        )


# --- the document rayflow writes: its name and the head's exposure ------------------------

_AUTH_MODE = re.compile(r"\bRAY_AUTH_MODE=([^;\s]*)")


def check_cluster_name(doc: Mapping, section: Mapping) -> str:
    """The written document's cluster_name (Ray's `default` where it has none), refused in one
    line naming where it came from: backend.overrides, the user's file, or backend.cluster_name."""
    name = doc.get("cluster_name", "default")
    problem = cluster_name_problem(name)
    if problem:
        if "cluster_name" in (section.get("overrides") or {}):
            raise ConfigError("backend.overrides.cluster_name", problem)
        if section.get("cluster_yaml"):
            raise ConfigError(
                "backend.cluster_yaml", f"{section['cluster_yaml']}: cluster_name: {problem}"
            )
        raise ConfigError("backend.cluster_name", problem)
    return name


def listening(provider: str | None) -> str:
    """What of a vm cluster listens beyond loopback, for the auth-off refusal."""
    if provider and providers.get(provider).in_place:
        return (
            f"with provider={provider} the {NODE_SERVERS} of its head and nodes on this "
            f"machine listen on all interfaces or its address ({NO_LOOPBACK})"
        )
    who = f"provider={provider}" if provider else "the cluster of backend.cluster_yaml"
    return (
        f"with {who} the head's GCS and Ray Client (port 10001) and every node's raylet and "
        "object manager listen on the nodes' network addresses, for the other nodes to reach"
    )


def check_exposure(doc: Mapping, section: Mapping, auth_mode: str) -> None:
    """Token auth off on the head, however the document came to say so: ray_auth_mode=disabled,
    or backend.overrides or the user's file dropping `export RAY_AUTH_MODE=token;` before the
    head's `ray start` (Ray's default is auth off). Refused in one line naming ray_auth_mode and
    the setting (rayflow.security.auth.refuse_auth_off): the nodes listen beyond loopback
    whatever the dashboard does. fake_multinode: rayflow starts the head itself."""
    provider = (doc.get("provider") or {}).get("type")
    refuse_auth_off(auth_mode, listening(provider))
    if providers.get(provider).in_place:
        return
    overrides = section.get("overrides") or {}
    if "head_start_ray_commands" in overrides:
        key = "backend.overrides.head_start_ray_commands"
    elif section.get("cluster_yaml"):
        key = f"backend.cluster_yaml {section['cluster_yaml']}: head_start_ray_commands"
    else:
        key = "the rendered head_start_ray_commands"
    for command in doc.get("head_start_ray_commands") or []:
        if not (isinstance(command, str) and "ray start" in command and "--head" in command):
            continue
        modes = _AUTH_MODE.findall(command.split("ray start")[0])
        if (modes[-1] if modes else None) != "token":
            refuse_auth_off(
                "disabled",
                listening(provider),
                f"{key}: the head's `ray start` without `export RAY_AUTH_MODE=token;` before it",
            )
