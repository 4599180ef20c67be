"""backend=vm: a kept cluster, acted on again from its record (rayflow.backends.kept) once the run
that kept it is gone: reached for `rayflow status` and `logs`, torn down by `rayflow down` and
`python -m rayflow.backends.vm.teardown`, and how the autostop watcher on its head stops it.

What a record holds of a vm cluster (`where`): the provider, and the fake cluster's temp dir and
dashboard URL, or the cluster YAML the run wrote in this user's cache (rayflow.backends.vm.owned;
records older than the cache name a temp dir). Nothing is read, run or torn down by what those
name unless it is this user's own, writable by no one else (vm.owned), and a cloud's VMs are
selected by their owner tag as well as their name (vm.owner). What stops a cluster is its
provider's one way (`Provider.terminate`, rayflow.backends.vm.providers), from this machine and
from the head alike. `down` raises ClusterError, one line saying what it could not reach and how
to finish by hand, rather than return as if done.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.backends.vm import owned, owner, providers
from rayflow.backends.vm.providers.base import Stop
from rayflow.errors import ClusterError
from rayflow.runtime.activity import reachable
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.processes import pids_mentioning

REACH_TIMEOUT_S = 20.0  # a status or logs call waits this long for a kept head's dashboard

# The keys of this side a job on the provider's VMs is not handed, by provider: the nodes have
# their own identity (aws: the instance profile of Ray's bootstrap role, which may use EC2 and S3).
NODE_IDENTITY = {p.name: p.withheld for p in providers.each() if p.withheld}
# The SDK providers' own errors, raised from their API calls (an endpoint away, keys refused).
CLOUD_ERRORS = ("botocore.", "googleapiclient.", "google.auth.", "google.api_core.")


def _in_place(where: dict[str, Any]) -> bool:
    """Whether a record's cluster is of the provider whose nodes are processes of this machine
    (kept by its temp dir), not one `ray up` started (kept by its cluster YAML)."""
    return providers.get(where.get("provider")).in_place


def where_fake(provider: str, temp_dir: str, url: str) -> dict[str, str]:
    return {"provider": provider, "temp_dir": temp_dir, "url": url}


def where_sdk(provider: str, config_file: str) -> dict[str, str]:
    return {"provider": provider, "config_file": config_file}


def autostop_fake(temp_dir: str, url: str) -> dict[str, str]:
    """The watcher stops the head's own processes (every one naming the temp dir) on this
    machine, as `rayflow down` does."""
    return {"backend": "vm", "kind": "processes", "temp_dir": temp_dir, "dashboard": url}


def autostop_sdk(provider: str, dashboard_port: int, owner_run: str = "") -> dict[str, str]:
    """On the head, from the config Ray's launcher left there (~/ray_bootstrap_config.yaml): SSH
    hosts get `ray stop` on each worker over SSH, then on the head; a cloud's nodes that carry
    the cluster's owner tag (`owner_run`) are terminated through its node provider, with the
    head's own role or service account."""
    kind = "ssh_hosts" if providers.get(provider).hosts else "node_provider"
    spec = {"backend": "vm", "kind": kind, "dashboard": f"http://127.0.0.1:{dashboard_port}"}
    return {**spec, "owner": owner_run} if kind == "node_provider" else spec


def reach(kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
    """A handle on the kept cluster's Jobs API, or None when it is gone (its head's processes or
    its dashboard are). An SSH tunnel it opens closes with the handle. ClusterError (one line)
    where it cannot be asked: SSH failed, or what its record names is not this user's own."""
    where = kept.where
    handle = ClusterHandle(kept.backend, name=kept.name, owner_run=kept.owner_run, kept=True)
    if _in_place(where):
        temp_dir, url = where.get("temp_dir", ""), where.get("url", "")
        if os.path.lexists(temp_dir):
            problem = owned.fake_dir_problem(temp_dir)
            if problem:
                raise ClusterError(f"vm cluster {kept.name}: {problem}: not asked")
        from rayflow.security.ports import url_held

        alive = bool(pids_mentioning(temp_dir) and url)
        # a port another user holds now (the dashboard died) is refused before the token is sent
        if not (alive and url_held(url, f"vm cluster {kept.name}") and reachable(url, headers)):
            return None
        handle.address, handle.submission = url, Submission(headers=headers, in_place=True)
        return handle
    return _reach_through_ssh(kept, handle, headers)


def kept_config(kept: KeptCluster) -> dict[str, Any]:
    """The kept cluster's YAML, read only as this user's own (vm.owned); ClusterError saying how
    to stop it by hand where it is not, or is gone."""
    path = kept.where.get("config_file", "")
    try:
        return owned.load(path)
    except ClusterError as err:
        raise ClusterError(f"vm cluster {kept.name}: {err}") from None
    except FileNotFoundError:
        raise ClusterError(
            f"vm cluster {kept.name}: its cluster YAML {path} is gone (kept before rayflow kept "
            f"them in your cache, and /tmp was cleaned since): rayflow cannot find its "
            f"{_machines(kept.where.get('provider', ''), kept.name)}; stop them by hand"
        ) from None


def _machines(provider: str, name: str) -> str:
    if providers.get(provider).hosts:
        return "hosts (`ray stop` on each)"
    return f"VMs (tagged ray-cluster-name={name}: terminate them in the cloud console)"


def _head_ip(config: dict[str, Any]) -> str | None:
    """The head's address, as its provider finds it (SSH hosts' from the file; a cloud's only
    among the VMs that carry the cluster's owner tag), or None when it knows no head."""
    provider = providers.get(config["provider"]["type"])
    try:
        return provider.head_ip(config, owner.owner_of(config))
    except RuntimeError:  # Ray's view: the provider knows no head of this name
        return None


def _reach_through_ssh(
    kept: KeptCluster, handle: ClusterHandle, headers: dict[str, str]
) -> ClusterHandle | None:
    from rayflow.backends.vm import tunnel
    from rayflow.backends.vm.commands import dashboard_port

    config = kept_config(kept)
    head_ip = _head_ip(config)
    if head_ip is None:
        return None
    with handle.unwound_on_error():
        proc, url = tunnel.open_tunnel(
            tunnel.ssh_auth(config), head_ip, dashboard_port(config), kept.name
        )
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
    dir `rf-vm-*` with its autoscaling.yaml; a cluster YAML where rayflow writes them), or None.
    A record is this user's own file, yet what it names is checked before anything is stopped by
    it: rayflow's, and this user's own, writable by no one else (vm.owned)."""
    if fake:
        return owned.fake_dir_problem(path)
    if not owned.made_by_rayflow(path):
        return f"{path} is not a cluster YAML rayflow wrote (~/.cache/rayflow/vm/NAME/NAME.yaml)"
    return owned.problem(Path(path).parent, folder=True) or owned.problem(path, folder=False)


def down(kept: KeptCluster, launcher_env: dict[str, str]) -> None:
    """Tear down what the run that kept it started, by its provider: the fake cluster's processes
    and temp dir, or the VMs or hosts its cluster YAML names (`stop_sdk`). The name's vm record
    goes with it. A fake cluster whose temp dir is gone is stopped by the processes that name it,
    if any still run; anything it cannot reach, or that is not this user's own, is a ClusterError
    (one line: what was not done, how to finish by hand), and nothing is removed."""
    from rayflow.backends.vm import state

    fake = _in_place(kept.where)
    path = kept.where.get("temp_dir" if fake else "config_file", "")
    if fake:
        if os.path.lexists(path):
            problem = not_rayflows(path, fake=True)
            if problem:
                raise ClusterError(f"vm cluster {kept.name}: {problem}: nothing stopped")
        if path:  # where a reboot or a tmp cleaner took the folder, its processes go by the name
            providers.get(kept.where["provider"]).terminate(Stop(path=path))
    else:
        kept_config(kept)  # gone, or not this user's: one line, nothing stopped
        with scoped_env(launcher_env):
            stop_sdk(path)
    state.forget(path)


def stop_sdk(config_file: str) -> None:
    """Tear down the cluster of a cluster YAML rayflow wrote, read as this user's own, by its
    provider: a cloud's VMs that carry its owner tag, terminated (stopped where the file says
    `cache_stopped_nodes: true`); SSH hosts' Ray stopped on every host; any other provider by
    Ray's teardown. Then the folder rayflow made for it goes. ClusterError where the file is not
    this user's, or something was not reached: nothing removed."""
    problem = not_rayflows(config_file, fake=False)
    if problem:
        raise ClusterError(f"{problem}: nothing stopped")
    config = owned.load(config_file)
    stop = Stop(path=config_file, config=config, owner=owner.owner_of(config) or "")
    try:
        providers.get(config["provider"]["type"]).terminate(stop)
    except Exception as err:  # the cloud SDKs' own errors only; the rest re-raised
        if not type(err).__module__.startswith(CLOUD_ERRORS):
            raise
        from rayflow.security.redaction import mask_text

        name = config["cluster_name"]
        raise ClusterError(
            f"cluster {name}: the cloud API refused or did not answer "
            f"({mask_text(' '.join(str(err).split()))[:300]}): nothing terminated; terminate "
            f"its VMs by hand (tags ray-cluster-name={name} and {owner.OWNER_TAG}={stop.owner})"
        ) from None
    owned.remove_folder(config_file)


def stop_local_workers(config: dict) -> list[str]:
    """`ray stop` on each worker host of a local-provider cluster over SSH, as Ray runs its
    commands, with the cluster's host keys pinned (rayflow.security.ssh: in this user's cache, on
    the head in the head user's). A host ssh could not reach, or whose key changed, is one
    warning line: its Ray may still run. Returns those hosts (`rayflow down` then keeps the
    record: it did not reach them)."""
    from rayflow.security import ssh

    auth = config.get("auth") or {}
    cluster = str(config.get("cluster_name", "default"))
    unreached = []
    for ip in config["provider"].get("worker_ips") or []:
        done = subprocess.run(
            ssh.command(
                auth,
                ip,
                cluster,
                key="provider.worker_ips",
                remote="bash --login -c -i 'ray stop'",
                connect_timeout_s=10,
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
        if done.returncode == 255:  # ssh's own failure, not `ray stop`'s
            why = ssh.failure(done.stderr, ip, cluster, done.returncode)
            print(
                f"rayflow: warning: `ray stop` was not run on worker host {ip}: {why}",
                file=sys.stderr,
                flush=True,
            )
            unreached.append(ip)
    return unreached


# --- from the head: what the watcher of an idle cluster (rayflow.autostop) runs --------------


def stop_idle(spec: dict[str, Any]) -> None:
    """Tear the cluster down from its own head, as its spec says (autostop_fake, autostop_sdk):
    `processes` (by the temp dir), `ssh_hosts` or `node_provider` (by the config Ray's launcher
    left on the head), each by its provider's one way of stopping it."""
    {
        "processes": _stop_processes,
        "ssh_hosts": _stop_launched,
        "node_provider": _stop_launched,
    }[spec["kind"]](spec)


def _stop_processes(spec: dict[str, Any]) -> None:
    # never stop processes by, or remove, a path that is not this user's fake cluster's
    problem = not_rayflows(spec["temp_dir"], fake=True)
    if problem:
        print(f"[autostop] {problem}", flush=True)
        return
    providers.in_place().terminate(Stop(path=spec["temp_dir"]))


def _stop_launched(spec: dict[str, Any]) -> None:
    """A cloud's nodes are selected by the cluster's owner tag (`owner` in the spec), never
    another party's of the same name; SSH hosts by the hosts the config names."""
    import yaml

    run_owner = str(spec.get("owner") or "")
    if spec["kind"] == "node_provider" and not run_owner:
        print(f"[autostop] no {owner.OWNER_TAG} in the spec: nothing terminated", flush=True)
        return
    config = yaml.safe_load((Path.home() / "ray_bootstrap_config.yaml").read_text())
    stop = Stop(config=config, owner=run_owner, on_head=True)
    providers.get(config["provider"]["type"]).terminate(stop)
