"""Every ssh command rayflow runs itself, built in one place: the tunnel to a remote head's
dashboard (rayflow.backends.vm.tunnel) and `ray stop` on SSH worker hosts, from this machine or
from the autostop watcher on the head (rayflow.backends.vm.kept.stop_local_workers).

- The destination comes after `--`, and its host and user are checked first (an IP address, or a
  host name of RFC 1123 labels; a user name of letters, digits, `.`, `_`, `-`), so a value such as
  `-oProxyCommand=...` is refused, never read by ssh as an option. The vm keys are held to the
  same rules before anything starts (rayflow.backends.vm.keys, user_file).
- Host keys are pinned per cluster, trust on first use: `StrictHostKeyChecking=accept-new` with
  `UserKnownHostsFile=<cache>/known_hosts/<cluster name>` in this user's private cache (on the
  head: the head user's own). The first contact records a host's key; a different key afterwards
  is refused by ssh, and `failure` turns that into one line saying how to clear the pin.

Ray's own launcher runs its ssh with `StrictHostKeyChecking=no` (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from rayflow.errors import ClusterError
from rayflow.security.auth import cache_dir, private_folder
from rayflow.security.redaction import mask_text

_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
# A cluster's name names its pin file (the vm keys allow these; nothing a path takes apart).
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed")
_PINNED_AS = re.compile(r"Host key for (\S+) has changed")


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def host_problem(value: object) -> str | None:
    """Why `value` cannot be an SSH host, or None: an IP address, or a host name of RFC 1123
    labels (letters, digits, inner `-`; at most 253 characters)."""
    if isinstance(value, str):
        try:
            ipaddress.ip_address(value)
            return None
        except ValueError:
            name = value[:-1] if value.endswith(".") else value
            if len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split(".")):
                return None
    return (
        f"{_shown(value)} is not a host: use an IP address or a host name (letters, digits, "
        "'-' inside dot-separated labels; no leading '-', spaces or shell characters)"
    )


def user_problem(value: object) -> str | None:
    """Why `value` cannot be an SSH user name, or None."""
    if isinstance(value, str) and _USER.fullmatch(value):
        return None
    return (
        f"{_shown(value)} is not a user name: use 1-32 letters, digits, '.', '_' and '-', not "
        "starting with '-'"
    )


def known_hosts(cluster: str) -> Path:
    """The pin file of a cluster's hosts, in this user's private cache."""
    if not _CLUSTER.fullmatch(cluster):
        raise ClusterError(f"{_shown(cluster)} is not a cluster name: no host keys pinned for it")
    return private_folder(cache_dir() / "known_hosts") / cluster


def forget_hosts(cluster: str) -> None:
    """Drop a cluster's pins: its hosts are new machines (a cloud cluster started again under the
    name, whose VMs may reuse an address), recorded again on first contact."""
    known_hosts(cluster).unlink(missing_ok=True)


def command(
    auth: Mapping,
    host: str,
    cluster: str,
    *,
    key: str = "provider.head_ip",
    options: Sequence[str] = (),
    remote: str | None = None,
    connect_timeout_s: int = 20,
) -> list[str]:
    """`ssh [OPTIONS] -- USER@HOST [REMOTE]` with the cluster's auth (`ssh_user`,
    `ssh_private_key`, `ssh_proxy_command`) and its pinned host keys; a bad host or user is a
    one-line ClusterError naming `key` (where the host came from) or `auth.ssh_user`."""
    problem = host_problem(host)
    if problem:
        raise ClusterError(f"{key}: {problem}")
    user = auth.get("ssh_user")
    if user is not None and user_problem(user):
        raise ClusterError(f"auth.ssh_user: {user_problem(user)}")
    private_key = auth.get("ssh_private_key")
    identity = (
        ["-i", os.path.expanduser(str(private_key)), "-o", "IdentitiesOnly=yes"]
        if private_key
        else []  # the ssh agent's
    )
    proxy = auth.get("ssh_proxy_command")
    return [
        "ssh",
        *identity,
        *(["-o", f"ProxyCommand={proxy}"] if proxy else []),
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        f"UserKnownHostsFile={known_hosts(cluster)}",
        "-o",
        "HashKnownHosts=no",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={int(connect_timeout_s)}",
        "-o",
        "LogLevel=ERROR",
        *options,
        "--",
        f"{user}@{host}" if user else host,
        *([remote] if remote is not None else []),
    ]


def host_key_changed(stderr: str) -> bool:
    return any(mark in stderr for mark in CHANGED)


def failure(stderr: str, host: str, cluster: str, code: int | None = None) -> str:
    """One line for an ssh that failed: a changed host key says so and how to clear the pin;
    anything else is ssh's last line (masked)."""
    if host_key_changed(stderr):
        found = _PINNED_AS.search(stderr)
        pinned = found.group(1) if found else host
        path = known_hosts(cluster)
        return (
            f"the host key of {host} changed since rayflow first reached it for cluster {cluster} "
            f"(pinned in {path}): someone may be intercepting the connection; if the host was "
            f"rebuilt, clear the pin with `ssh-keygen -R {pinned} -f {path}` and run again"
        )
    last = [line for line in stderr.splitlines() if line.strip()][-1:]
    return mask_text(last[0].strip()) if last else f"ssh exit code {code}"
