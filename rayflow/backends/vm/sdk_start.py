"""backend=vm provider=local, aws, gcp: the cluster from Ray's cluster launcher through its SDK
(`create_or_update_cluster`, `teardown_cluster`, the library behind `ray up`/`ray down`), its head
reached through an SSH tunnel to its loopback (vm.tunnel); what differs by provider, its
(rayflow.backends.vm.providers).

Cloud and host clusters are found by name (tags, Ray's cluster-NAME.state): `ray up` never runs
over a live cluster this run did not start; one is joined (`no_restart=True`) only when a run of
this user kept it and none holds it, else refused in one line (vm.state); on a cloud, so is any VM
of the name that is not that kept cluster's (vm.owner). The cluster YAML goes to this user's cache
(vm.owned), where `rayflow down` and the teardown command find it after a reboot too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.handle import ClusterHandle
from rayflow.backends.vm import cloud_up, internals, owned, owner, providers, state, tunnel
from rayflow.backends.vm import kept as vm_kept
from rayflow.backends.vm.checks import require_filled
from rayflow.backends.vm.commands import dashboard_port, launcher_output
from rayflow.backends.vm.config import launcher_env
from rayflow.backends.vm.kept import stop_local_workers
from rayflow.backends.vm.providers import Provider
from rayflow.backends.vm.providers.base import ray_down
from rayflow.backends.vm.start import (
    Start,
    Starting,
    kept_note,
    teardown_is,
    token_file,
    wait_for_dashboard,
)
from rayflow.errors import ClusterError
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.progress import phase
from rayflow.security import ssh
from rayflow.security.redaction import mask_text


def start(vm: Starting, run: Start) -> str:
    """The dashboard URL (through the SSH tunnel) of the cluster this run starts, or of the kept
    one it joins."""
    if not vm.cluster_yaml:
        require_filled(vm.section)
    config, provider = vm.cluster_config(), providers.get(vm.provider)
    # Cloud and host clusters are found by name (tags, Ray's cluster-NAME.state): one is
    # joined only when a run of this user kept it and none holds it, else refused; on a
    # cloud, so is any VM of the name that is not that kept cluster's (vm.owner).
    kept = state.claim(
        run.name,
        run.run_id,
        vm.provider,
        vm.keeps_cluster,
        lambda recorded: _running(provider, config, recorded),
    )
    run.handle.on_stop("let go of the cluster's name", state.release, run.name, run.run_id)
    if kept:
        run.handle.owner_run = kept.get("owner_run") or run.handle.owner_run
    if provider.tagged:  # every VM it makes carries the cluster's owner
        config = owner.tag(config, str(run.handle.owner_run))
    _config_file(vm, run, config, kept)
    _ray_up(vm, run, bool(kept))
    run.handle.where = vm_kept.where_sdk(vm.provider, run.config_file)
    run.handle.autostop = vm_kept.autostop_sdk(
        vm.provider, dashboard_port(config), str(run.handle.owner_run)
    )
    if kept or vm.keeps_cluster:
        run.handle.kept, run.handle.joined = True, bool(kept)
        kept_note(run)
    return _tunnel(vm, run.handle, config, _head_ip(provider, run, config))


def _running(provider: Provider, config: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
    """Whether a head of this cluster's name runs: the provider's own view (on a cloud, refused
    in one line while a VM of the name runs that the kept cluster of `recorded` did not start:
    vm.owner), else Ray's."""
    found = provider.running(config, recorded)
    return _head_running(config) if found is None else found


def _head_running(config: dict) -> bool:
    """Whether the provider knows a live head of this cluster's name (Ray's own view: cloud tags,
    the local provider's cluster-NAME.state)."""
    from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND

    provider = internals.node_provider(config["provider"], config["cluster_name"])
    return bool(provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD}))


def _head_ip(provider: Provider, run: Start, config: dict[str, Any]) -> str:
    """The head the tunnel goes to, as its provider finds it: on a cloud, the one VM of the
    name that carries the cluster's owner tag, never another party's of the same name."""
    ip = provider.head_ip(config, str(run.handle.owner_run))
    if ip is None:
        raise ClusterError(
            f"backend=vm provider={provider.name}: `ray up` finished, yet no head VM of "
            f"cluster {run.name} carries its owner tag ({owner.OWNER_TAG})"
        )
    return ip


def _config_file(
    vm: Starting, run: Start, config: dict[str, Any], kept: dict[str, Any] | None
) -> None:
    """The cluster YAML `ray up` reads, in this user's cache (vm.owned: 0600 in a 0700
    folder, never /tmp), where `rayflow down` and the teardown command find it after a reboot
    too; the teardown of a cluster this run starts and does not keep, registered before
    `ray up` (a `ray up` that failed halfway is torn down too). A cloud's VMs are terminated
    by their owner tag (`_launch_vms`), never by Ray's teardown, which selects by name."""

    recorded = str((kept or {}).get("stop") or "")
    # a kept cluster's config stays where its run wrote it while that folder is still this
    # user's own (records older than the cache named a temp dir); else it goes to the cache
    usable = bool(recorded) and owned.folder_usable(recorded)
    run.config_file = recorded if usable else str(owned.cluster_file(run.name))
    run.temp_dir = os.path.dirname(run.config_file)
    owned.write(run.config_file, config)
    teardown_is(run, run.config_file)
    # the teardown command names this file, and a later run's refusal names that command
    state.update(run.name, run.run_id, stop=run.config_file)
    if kept or vm.keeps_cluster:
        return
    run.handle.on_stop("remove the cluster config's folder", owned.remove_folder, run.config_file)
    provider = providers.get(vm.provider)
    if provider.tagged:
        return
    if provider.hosts:
        run.handle.on_stop(
            "stop Ray on the worker hosts (ray down stops only the head)",
            stop_local_workers,
            config,
        )
    run.handle.on_stop(f"tear down cluster {run.name}", ray_down, run.config_file)


def _ray_up(vm: Starting, run: Start, kept: bool) -> None:
    """`ray up` through Ray's SDK; it never restarts Ray on a running cluster: one this run did
    not start is only ever a kept one it joins (`--no-restart`)."""
    import click  # Ray's launcher reports its failures as click exceptions
    from ray.autoscaler import sdk

    # v1 for local (ray#59905)
    env = launcher_env(vm.section, vm.auth_mode, token_file(), provider=vm.provider)
    what = (
        f"joining the kept cluster {run.name} (as `ray up --no-restart`)"
        if kept
        else f"creating cluster {run.name} (provider {vm.provider}, as `ray up`)"
    )

    def up() -> None:
        sdk.create_or_update_cluster(
            run.config_file, no_restart=kept, restart_only=False, no_config_cache=True
        )

    with scoped_env(env), launcher_output(), phase(what, "vm"):
        try:
            if providers.get(vm.provider).tagged and not kept:  # an end, and a search by tags
                _launch_vms(vm, run, up)
            else:
                up()
        # Ray's launcher aborts with one (a host it cannot reach, a setup command that failed)
        except click.ClickException as err:
            raise ClusterError(
                f"backend=vm provider={vm.provider}: `ray up` failed: "
                f"{mask_text(err.format_message() or 'see its output above')}"
            ) from None


def _launch_vms(vm: Starting, run: Start, up: Callable[[], None]) -> None:
    """`ray up` of a cloud cluster, in a thread waited for at most start_timeout_s; the undo
    that terminates every VM of the cluster (by its tags) is registered first, and a kept
    one's applies only where the start did not finish (rayflow.backends.vm.cloud_up)."""
    handed = cloud_up.Launch(run.name)
    config = yaml.safe_load(Path(run.config_file).read_text())
    if vm.keeps_cluster:
        run.handle.on_stop(
            f"terminate the VMs of cluster {run.name} if its start did not finish",
            cloud_up.terminate_unless_up,
            config,
            handed,
        )
    else:
        run.handle.on_stop(
            f"terminate every VM of cluster {run.name} (found by its tags)",
            cloud_up.terminate_all,
            config,
            handed,
        )
    timeout = float(vm.section.start_timeout_s)
    cloud_up.launch(up, run.name, timeout, handed, f"backend=vm provider={vm.provider}")


def _tunnel(vm: Starting, handle: ClusterHandle, config: dict[str, Any], head_ip: str) -> str:
    """The head's dashboard through an SSH tunnel to its loopback (vm.tunnel), stopped with the
    run."""
    cluster = str(config.get("cluster_name", "default"))
    if providers.get(vm.provider).tagged and not handle.joined:
        # new VMs, whose addresses earlier ones of the name may have had: pinned afresh
        ssh.forget_hosts(cluster)
    opened, url = tunnel.open_tunnel(
        tunnel.ssh_auth(config), head_ip, dashboard_port(config), cluster
    )
    handle.on_stop("close the SSH tunnel to the head's dashboard", tunnel.close_tunnel, opened)
    deadline = time.monotonic() + float(vm.section.start_timeout_s)
    with phase(
        f"waiting for the head's dashboard through an SSH tunnel to {head_ip} ({url})", "vm"
    ):
        while True:
            failed = tunnel.tunnel_failed(opened)
            if failed:
                raise failed
            try:
                wait_for_dashboard(url, 2, f"backend=vm provider={vm.provider}")
                return str(url)
            except ClusterError:
                if time.monotonic() > deadline:
                    raise
