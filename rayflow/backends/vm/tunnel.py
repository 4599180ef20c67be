"""backend=vm: the head's dashboard reached through an SSH tunnel, as `ray dashboard` does.

A head on another machine (provider local, aws, gcp) listens on its own loopback
(`--dashboard-host=127.0.0.1`); rayflow forwards a loopback port of this machine to it over SSH
with the cluster's own auth settings (`auth.ssh_user`, `auth.ssh_private_key`,
`auth.ssh_proxy_command`, as Ray's launcher bootstraps them), so the Jobs API and its bearer token
never cross the network in clear. The tunnel lives as long as the run and is stopped with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping

from rayflow.errors import ClusterError
from rayflow.security.redaction import mask_text


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ssh_auth(config: Mapping) -> dict:
    """The cluster's SSH settings as Ray's launcher uses them: its bootstrapped config (an AWS
    key pair Ray made is filled in there), else the file's own `auth`."""
    from ray.autoscaler._private.commands import _bootstrap_config

    try:
        return dict(_bootstrap_config(dict(config), no_config_cache=True).get("auth") or {})
    except (KeyError, ValueError, RuntimeError):  # a provider that bootstraps nothing of auth
        return dict(config.get("auth") or {})


def tunnel_command(auth: Mapping, head_ip: str, local_port: int, remote_port: int) -> list[str]:
    """`ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE USER@HEAD` with the cluster's auth; host keys
    as Ray's launcher treats them (not pinned: the head is a fresh machine)."""
    key = (
        ["-i", os.path.expanduser(str(auth["ssh_private_key"])), "-o", "IdentitiesOnly=yes"]
        if auth.get("ssh_private_key")
        else []
    )
    proxy = (
        ["-o", f"ProxyCommand={auth['ssh_proxy_command']}"] if auth.get("ssh_proxy_command") else []
    )
    user = f"{auth['ssh_user']}@" if auth.get("ssh_user") else ""
    return [
        "ssh",
        "-N",
        *key,
        *proxy,
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=20",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
        "-o",
        "LogLevel=ERROR",
        "-L",
        f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}",
        f"{user}{head_ip}",
    ]


def open_tunnel(auth: Mapping, head_ip: str, remote_port: int) -> tuple[subprocess.Popen, str]:
    """The tunnel's ssh process and the local URL of the head's dashboard."""
    port = free_local_port()
    proc = subprocess.Popen(
        tunnel_command(auth, head_ip, port, remote_port),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def tunnel_failed(proc: subprocess.Popen) -> ClusterError | None:
    """The error of a tunnel whose ssh exited (its last line), else None."""
    if proc.poll() is None:
        return None
    last = [
        line for line in (proc.stderr.read() if proc.stderr else "").splitlines() if line.strip()
    ][-1:]
    return ClusterError(
        f"backend=vm: the SSH tunnel to the head's dashboard failed: "
        f"{mask_text(last[0]) if last else f'ssh exit code {proc.returncode}'}"
    )


def close_tunnel(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.stderr:
        proc.stderr.close()
