"""backend=vm: a kept cluster, acted on again from its record (rayflow.backends.kept) once the run
that kept it is gone: reached for `rayflow status` and `logs`, torn down by `rayflow down` and
`python -m rayflow.teardown`, and how the autostop watcher on its head stops it.

What a record holds of a vm cluster (`where`): the provider, and the fake cluster's temp dir and
dashboard URL, or the cluster YAML the run wrote (the SDK providers' teardown reads it, as `ray
down` does). Nothing is torn down that those do not name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.errors import ClusterError
from rayflow.runtime.activity import reachable
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.processes import (
    kill_processes_mentioning,
    pids_mentioning,
    stop_processes_mentioning,
)

REACH_TIMEOUT_S = 20.0  # a status or logs call waits this long for a kept head's dashboard

# The keys of this side a job on the provider's VMs is not handed: the nodes have their own
# identity (aws: the instance profile of Ray's bootstrap role, which may use EC2 and S3).
NODE_IDENTITY = {"aws": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}


def where_fake(temp_dir: str, url: str) -> dict[str, str]:
    return {"provider": "fake_multinode", "temp_dir": temp_dir, "url": url}


def where_sdk(provider: str, config_file: str) -> dict[str, str]:
    return {"provider": provider, "config_file": config_file}


def autostop_fake(temp_dir: str, url: str) -> dict[str, str]:
    """The watcher stops the head's own processes (every one naming the temp dir) on this
    machine, as `rayflow down` does."""
    return {"kind": "processes", "temp_dir": temp_dir, "dashboard": url}


def autostop_sdk(provider: str, dashboard_port: int) -> dict[str, str]:
    """On the head, from the config Ray's launcher left there (~/ray_bootstrap_config.yaml): SSH
    hosts get `ray stop` on each worker over SSH, then on the head; a cloud's nodes are
    terminated through its node provider, with the head's own role or service account."""
    kind = "ssh_hosts" if provider == "local" else "node_provider"
    return {"kind": kind, "dashboard": f"http://127.0.0.1:{dashboard_port}"}


def reach(kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
    """A handle on the kept cluster's Jobs API, or None when it is gone (its head's processes or
    its dashboard are). An SSH tunnel it opens closes with the handle."""
    where = kept.where
    handle = ClusterHandle(kept.backend, name=kept.name, owner_run=kept.owner_run, kept=True)
    if where.get("provider") == "fake_multinode":
        url = where.get("url", "")
        if not (pids_mentioning(where.get("temp_dir", "")) and url and reachable(url, headers)):
            return None
        handle.address, handle.submission = url, Submission(headers=headers, in_place=True)
        return handle
    return _reach_through_ssh(kept, handle, headers)


def _reach_through_ssh(
    kept: KeptCluster, handle: ClusterHandle, headers: dict[str, str]
) -> ClusterHandle | None:
    from ray.autoscaler import sdk

    from rayflow.backends.vm import tunnel
    from rayflow.backends.vm.commands import dashboard_port

    config_file = kept.where.get("config_file", "")
    if not Path(config_file).is_file():
        return None
    config = yaml.safe_load(Path(config_file).read_text())
    try:
        head_ip = sdk.get_head_node_ip(config_file)
    except RuntimeError:  # the provider knows no head of this name
        return None
    with handle.unwound_on_error():
        proc, url = tunnel.open_tunnel(tunnel.ssh_auth(config), head_ip, dashboard_port(config))
        handle.on_stop("close the SSH tunnel to the head's dashboard", tunnel.close_tunnel, proc)
        deadline = time.monotonic() + REACH_TIMEOUT_S
        while not reachable(url, headers, timeout_s=2):
            failed = tunnel.tunnel_failed(proc)
            if failed:  # SSH itself: the host may be there, only out of reach now
                raise ClusterError(f"vm cluster {kept.name}: {failed}")
            if time.monotonic() > deadline:
                handle.unwind()
                return None  # the host answers SSH, its Ray does not: it was stopped
            time.sleep(0.5)
    withheld = NODE_IDENTITY.get(str(config["provider"]["type"]), ())
    handle.address, handle.submission = url, Submission(headers=headers, withheld=withheld)
    return handle


def not_rayflows(path: str, fake: bool) -> str | None:
    """Why `path` is not what a run of this user's made for a vm cluster (a fake cluster's temp
    dir `rf-vm-*` with its autoscaling.yaml; a cluster YAML in such a folder), or None. A record
    is this user's own file, yet what it names is checked before anything is stopped by it."""
    folder = Path(path) if fake else Path(path).parent
    made = folder / "autoscaling.yaml" if fake else Path(path)
    try:
        mine = folder.stat().st_uid == os.getuid() and made.is_file()
    except OSError:
        mine = False
    if folder.name.startswith("rf-vm-") and mine:
        return None
    what = "a fake_multinode cluster's temp dir" if fake else "a cluster YAML rayflow wrote"
    return f"{path} is not {what} of yours (rf-vm-*): nothing stopped"


def down(kept: KeptCluster, launcher_env: dict[str, str]) -> None:
    """Tear down what the run that kept it started: the fake cluster's processes and temp dir, or
    the SDK's `teardown_cluster` of its cluster YAML (and `ray stop` on SSH worker hosts, which
    Ray's teardown leaves running). Idempotent; the name's vm record goes with it. A path that
    is gone is a cluster gone; one that is not rayflow's is refused."""
    from rayflow.backends.vm import state

    fake = kept.where.get("provider") == "fake_multinode"
    path = kept.where.get("temp_dir" if fake else "config_file", "")
    if Path(path).exists():
        problem = not_rayflows(path, fake)
        if problem:
            raise ClusterError(f"vm cluster {kept.name}: {problem}")
        if fake:
            stop_fake(path)
        else:
            with scoped_env(launcher_env):
                stop_sdk(path)
    state.forget(path)


def stop_fake(temp_dir: str) -> None:
    stop_processes_mentioning(temp_dir)
    kill_processes_mentioning(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def stop_sdk(config_file: str) -> None:
    from ray.autoscaler import sdk

    config: dict[str, Any] = yaml.safe_load(Path(config_file).read_text())
    sdk.teardown_cluster(config_file)
    if config.get("provider", {}).get("type") == "local":
        stop_local_workers(config)
    folder = os.path.dirname(config_file)
    if os.path.basename(folder).startswith("rf-vm-"):  # the temp dir the run made for it
        shutil.rmtree(folder, ignore_errors=True)


def stop_local_workers(config: dict) -> None:
    """`ray stop` on each worker host of a local-provider cluster over SSH, as Ray runs its
    commands."""
    auth = config.get("auth") or {}
    # else the ssh agent's
    key = ["-i", os.path.expanduser(auth["ssh_private_key"])] if auth.get("ssh_private_key") else []
    user = f"{auth['ssh_user']}@" if auth.get("ssh_user") else ""
    for ip in config["provider"].get("worker_ips") or []:
        subprocess.run(
            [
                "ssh",
                *key,
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                f"{user}{ip}",
                "bash --login -c -i 'ray stop'",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
