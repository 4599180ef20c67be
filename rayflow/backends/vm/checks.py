"""backend=vm: the checks of the `backend:` section, before anything starts.

`check` holds the section to its schema (rayflow.schema.vm: every key's kind and the rules
between keys, keys of outdated guides named with what replaced them) and then to what `ray up`
needs on this machine; `placeholders` lists what only the user can fill in, `placeholder_note`
is the line a dry run prints about them, and `require_filled` refuses them before a real start.
Nothing started, no cloud credentials read.
"""

from __future__ import annotations

import os
import shutil
from typing import Mapping

from omegaconf import DictConfig

from rayflow.backends.vm.defaults import gcp_zone, plain_section, with_defaults
from rayflow.errors import ConfigError
from rayflow.schema import validate_section
from rayflow.schema.vm import Vm

# What only the user can fill in, per provider.
USER_KEYS = {"gcp": ("project_id",), "local": ("head_ip", "worker_ips", "ssh_user", "ssh_private_key")}


def check(section: DictConfig | Mapping, gpu: bool, auth_mode: str = "token") -> None:
    """Raise ConfigError naming the key for a bad `backend:` section of backend=vm.

    Starts nothing and reads no cloud credentials; for the providers `ray up` starts (local,
    aws, gcp) it looks for `ssh` and `rsync` on PATH and checks that a given SSH key file can
    be read. Placeholders pass (a dry run renders them); `require_filled` refuses them before
    a real start. gpu: the run uses GPUs (the GPU node type is rendered); auth_mode: the run's
    ray_auth_mode (an exposed dashboard needs `token`)."""
    raw = plain_section(section)
    if gpu != (raw.get("compute_device") == "cuda"):  # the schema's rules read the device from the section
        raw["compute_device"] = "cuda" if gpu else "cpu"
    validate_section("backend", Vm, raw, {"ray_auth_mode": auth_mode})
    b = with_defaults(raw)
    key_file = b.get("ssh_private_key")
    if key_file is not None:  # also with backend.cluster_yaml, whose auth it then sets
        path = os.path.expanduser(key_file)
        # The path itself stays out of the message: secret-named keys are masked everywhere.
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError("backend.ssh_private_key", "cannot be read: no such file, not a file, or no permission to read it")
    if b["provider"] != "fake_multinode" and b.get("cluster_yaml") is None:  # a file's provider: check_tools
        check_tools(b["provider"])


def check_tools(provider: str, key: str = "backend.provider") -> None:
    """What `ray up` needs on this machine: it reaches every node with ssh and syncs files
    (its own config on the head, the token) with rsync."""
    for tool, package in (("ssh", "openssh-client"), ("rsync", "rsync")):
        if shutil.which(tool) is None:
            raise ConfigError(key, f"provider={provider} runs `{tool}` from this machine (ray up), and it is not on PATH: apt-get install {package}")


# --- placeholders ---------------------------------------------------------------------------


def placeholders(section: DictConfig | Mapping) -> list[str]:
    """The keys only the user can fill in that are still unset (`backend.project_id`, ...),
    in the order they should be filled in."""
    b = with_defaults(section)
    keys = [f"backend.{key}" for key in USER_KEYS.get(b.get("provider"), ()) if b.get(key) in (None, "", [])]
    if b.get("provider") == "gcp" and gcp_zone(b) is None:
        keys.append("backend.availability_zone")
    return keys


def placeholder_note(section: DictConfig | Mapping) -> str | None:
    """The one line a dry run prints when placeholders are left, or None."""
    keys = placeholders(section)
    if not keys:
        return None
    return f"rayflow: dry run: fill in {', '.join(keys)} before a real start (the printed config shows <fill in: ...> there)"


def require_filled(section: DictConfig | Mapping) -> None:
    """Refuse a real start while a placeholder is left: ConfigError naming the first key."""
    keys = placeholders(section)
    if keys:
        provider = with_defaults(section).get("provider")
        raise ConfigError(keys[0], f"must be filled in before provider={provider} can start (see backends/vm/{provider}.yaml); still unset: {', '.join(keys)}")
