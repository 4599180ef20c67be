"""backend=vm: a kept cluster, acted on again from its record (rayflow.backends.kept) once the run
that kept it is gone: reached for `rayflow status` and `logs`, torn down by `rayflow down` and
`python -m rayflow.backends.vm.teardown`, and how the autostop watcher on its head stops it.

What a record holds of a vm cluster (`where`): the provider, and the fake cluster's temp dir and
dashboard URL, or the cluster YAML the run wrote in this user's cache (rayflow.backends.vm.owned;
records older than the cache name a temp dir). Nothing is read, run or torn down by what those
name unless it is this user's own, writable by no one else (vm.owned), and a cloud's VMs are
selected by their owner tag as well as their name (vm.owner). `down` raises ClusterError, one
line saying what it could not reach and how to finish by hand, rather than return as if done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.backends.vm import internals, owned, owner
from rayflow.backends.vm.commands import launcher_output
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
# The SDK providers' own errors, raised from their API calls (an endpoint away, keys refused).
CLOUD_ERRORS = ("botocore.", "googleapiclient.", "google.auth.", "google.api_core.")


def where_fake(temp_dir: str, url: str) -> dict[str, str]:
    return {"provider": "fake_multinode", "temp_dir": temp_dir, "url": url}


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
    kind = "ssh_hosts" if provider == "local" else "node_provider"
    spec = {"backend": "vm", "kind": kind, "dashboard": f"http://127.0.0.1:{dashboard_port}"}
    return {**spec, "owner": owner_run} if kind == "node_provider" else spec


def reach(kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
    """A handle on the kept cluster's Jobs API, or None when it is gone (its head's processes or
    its dashboard are). An SSH tunnel it opens closes with the handle. ClusterError (one line)
    where it cannot be asked: SSH failed, or what its record names is not this user's own."""
    where = kept.where
    handle = ClusterHandle(kept.backend, name=kept.name, owner_run=kept.owner_run, kept=True)
    if where.get("provider") == "fake_multinode":
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
    if provider == "local":
        return "hosts (`ray stop` on each)"
    return f"VMs (tagged ray-cluster-name={name}: terminate them in the cloud console)"


def _head_ip(config: dict[str, Any]) -> str | None:
    """The head's address, or None when its provider knows no head of the cluster: SSH hosts'
    from the file (Ray's local provider state in /tmp may be gone), a cloud's only among the VMs
    that carry the cluster's owner tag."""
    from ray.autoscaler import sdk

    kind = config["provider"]["type"]
    if kind == "local":
        return str(config["provider"].get("external_head_ip") or config["provider"]["head_ip"])
    if kind in owner.TAGGED:
        run_owner = owner.owner_of(config)
        if not run_owner:  # its VMs are known by name only: another party's head would pass
            raise ClusterError(
                f"cluster {config['cluster_name']}: its cluster YAML carries no "
                f"{owner.OWNER_TAG} tag (kept by an older rayflow): not asked"
            )
        return owner.head_ip(config, run_owner)
    try:
        return str(sdk.get_head_node_ip(config))
    except RuntimeError:  # the provider knows no head of this name
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
    """Tear down what the run that kept it started: the fake cluster's processes and temp dir, or
    the VMs or hosts its cluster YAML names (`stop_sdk`). The name's vm record goes with it.
    A fake cluster whose temp dir is gone is stopped by the processes that name it, if any still
    run; anything it cannot reach, or that is not this user's own, is a ClusterError (one line:
    what was not done, how to finish by hand), and nothing is removed."""
    from rayflow.backends.vm import state

    fake = kept.where.get("provider") == "fake_multinode"
    path = kept.where.get("temp_dir" if fake else "config_file", "")
    if fake:
        if os.path.lexists(path):
            problem = not_rayflows(path, fake=True)
            if problem:
                raise ClusterError(f"vm cluster {kept.name}: {problem}: nothing stopped")
            stop_fake(path)
        elif path:  # a reboot or a tmp cleaner took the folder: its processes go by the name
            stop_processes_mentioning(path)
            kill_processes_mentioning(path)
    else:
        kept_config(kept)  # gone, or not this user's: one line, nothing stopped
        with scoped_env(launcher_env):
            stop_sdk(path)
    state.forget(path)


def stop_fake(temp_dir: str) -> None:
    """Stop a fake cluster's processes and remove its temp dir (checked by the caller to be
    this user's own: `not_rayflows`)."""
    stop_processes_mentioning(temp_dir)
    kill_processes_mentioning(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def stop_sdk(config_file: str) -> None:
    """Tear down the cluster of a cluster YAML rayflow wrote, read as this user's own: a cloud's
    VMs that carry its owner tag, terminated (stopped where the file says
    `cache_stopped_nodes: true`); SSH hosts' Ray stopped on every host; any other provider by
    Ray's teardown. Then the folder rayflow made for it goes. ClusterError where the file is not
    this user's, or something was not reached: nothing removed."""
    from ray.autoscaler import sdk

    problem = not_rayflows(config_file, fake=False)
    if problem:
        raise ClusterError(f"{problem}: nothing stopped")
    config = owned.load(config_file)
    kind = config["provider"]["type"]
    if kind in owner.TAGGED:
        _terminate_owned(config)
    elif kind == "local":
        _stop_hosts(config)
    else:
        with launcher_output():
            sdk.teardown_cluster(config)
    owned.remove_folder(config_file)


def _terminate_owned(config: dict[str, Any]) -> None:
    name = config["cluster_name"]
    run_owner = owner.owner_of(config)
    if not run_owner:
        raise ClusterError(
            f"cluster {name}: its cluster YAML carries no {owner.OWNER_TAG} tag (started by a "
            "rayflow before owner tags, or not by rayflow): nothing terminated; terminate its VMs "
            f"by hand (`ray down` of the file terminates every VM named {name} in the account, "
            "another user's too)"
        )
    try:
        stop = config["provider"].get("cache_stopped_nodes") is True
        owner.terminate(config, run_owner, stop_cached=stop)
    except Exception as err:  # the cloud SDKs' own errors only; the rest re-raised
        if not type(err).__module__.startswith(CLOUD_ERRORS):
            raise
        from rayflow.security.redaction import mask_text

        raise ClusterError(
            f"cluster {name}: the cloud API refused or did not answer "
            f"({mask_text(' '.join(str(err).split()))[:300]}): nothing terminated; terminate "
            f"its VMs by hand (tags ray-cluster-name={name} and {owner.OWNER_TAG}={run_owner})"
        ) from None


def _stop_hosts(config: dict[str, Any]) -> None:
    """`ray stop` over SSH on every host of an SSH-hosts cluster, the head last (Ray's own
    teardown finds the head through its provider's state in /tmp, which a reboot or a tmp
    cleaner removes); then Ray's record of them, if still there and this user's, marked
    stopped."""
    settings = config["provider"]
    hosts = {**settings, "worker_ips": [*(settings.get("worker_ips") or []), settings["head_ip"]]}
    unreached = stop_local_workers({**config, "provider": hosts}) or []
    if unreached:
        raise ClusterError(
            f"cluster {config['cluster_name']}: SSH did not reach {', '.join(unreached)}: Ray may "
            "still run there; run `ray stop` on those hosts by hand"
        )
    name = config["cluster_name"]
    state_path = internals.local_state_path(name)
    if os.path.lexists(state_path) and owned.ray_local_state_problem(name) is None:
        provider = internals.node_provider(settings, name)
        provider.terminate_nodes(provider.non_terminated_nodes({}))


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
    `processes`, `ssh_hosts` or `node_provider`."""
    {
        "processes": _stop_processes,
        "ssh_hosts": _stop_ssh_hosts,
        "node_provider": _stop_node_provider,
    }[spec["kind"]](spec)


def _stop_processes(spec: dict[str, Any]) -> None:
    # never stop processes by, or remove, a path that is not this user's fake cluster's
    problem = not_rayflows(spec["temp_dir"], fake=True)
    if problem:
        print(f"[autostop] {problem}", flush=True)
        return
    stop_fake(spec["temp_dir"])


def _stop_ssh_hosts(spec: dict[str, Any]) -> None:
    """`ray stop` on each worker host over SSH, the hosts' keys pinned per cluster in the head
    user's own cache (rayflow.security.ssh, as from the client), then on the head, which stops
    even where a worker could not be reached."""
    import yaml

    config = yaml.safe_load((Path.home() / "ray_bootstrap_config.yaml").read_text())
    try:
        stop_local_workers(config)  # its auth names the key the launcher copied to the head
    except ClusterError as err:  # a worker address that is not a host: never passed to ssh
        print(f"[autostop] {err}", flush=True)
    subprocess.run(["ray", "stop"], timeout=300, check=False)


def _stop_node_provider(spec: dict[str, Any]) -> None:
    """The cluster's VMs that carry its owner tag (rayflow.backends.vm.owner), workers first,
    then the head itself; another party's VMs of the same name are never selected."""
    import yaml
    from ray.autoscaler.tags import NODE_KIND_HEAD

    run_owner = str(spec.get("owner") or "")
    if not run_owner:
        print(f"[autostop] no {owner.OWNER_TAG} in the spec: nothing terminated", flush=True)
        return
    config = yaml.safe_load((Path.home() / "ray_bootstrap_config.yaml").read_text())
    provider = owner.provider_of(config)
    found = owner.nodes(provider, run_owner)
    heads = set(owner.nodes(provider, run_owner, NODE_KIND_HEAD))
    workers = [node for node in found if node not in heads]
    if workers:
        provider.terminate_nodes(workers)
    if heads:  # itself last
        provider.terminate_nodes(sorted(heads))
