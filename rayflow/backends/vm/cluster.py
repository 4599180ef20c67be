"""backend=vm: a Ray cluster from Ray's cluster launcher, running the workload as a Ray Job.

`fake_multinode` (the default) is Ray's real autoscaler launching worker nodes as processes
on this machine: rayflow starts the head itself (`RAY_FAKE_CLUSTER=1 ray start --head` with
an autoscaling config it writes completely) in a temp dir of its own, and stops exactly the
processes that name it. `local` (SSH hosts), `aws` and `gcp` go through Ray's SDK
(`create_or_update_cluster`, `teardown_cluster`), the library behind `ray up`/`ray down`.
The run itself is submitted to the head (rayflow.orchestrator.submission); nothing connects this
driver. A head on another machine is reached through an SSH tunnel to its loopback (vm.tunnel).
With `backend.cluster_yaml` the user's own cluster YAML is the cluster (vm.user_file,
vm.user_additions), started the same way by its provider.

Clusters have owners (vm.state): a run tears down only the cluster it started and did not keep;
it joins a cluster of its name only when that cluster was kept and no live run holds it, and is
refused in one line otherwise. The SDK providers never run `ray up` over a live cluster this run
did not start, and join a kept one with `no_restart=True`.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rayflow.backends.base import ClusterBackend, Rendered, WorkerPreload
from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.backends.vm import (
    cloud_up,
    internals,
    kept_ops,
    owned,
    owner,
    state,
    tunnel,
    user_file,
)
from rayflow.backends.vm.checks import (
    check,
    check_cluster_name,
    check_exposure,
    check_tools,
    placeholder_note,
    require_filled,
)
from rayflow.backends.vm.commands import (
    dashboard_port,
    head_args,
    launch_note,
    launcher_env,
    launcher_output,
)
from rayflow.backends.vm.config import render
from rayflow.backends.vm.defaults import with_defaults
from rayflow.backends.vm.kept_ops import stop_local_workers
from rayflow.backends.vm.keys import CLOUDS
from rayflow.backends.vm.user_additions import render_file
from rayflow.errors import ClusterError, ConfigError
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.processes import (
    kill_processes_mentioning,
    pids_mentioning,
    stop_processes_mentioning,
)
from rayflow.runtime.progress import phase
from rayflow.security import ports, ssh
from rayflow.security.auth import auth_token, ensure_token, token_path
from rayflow.security.redaction import mask_text

# The head's ports beside its GCS and dashboard that rayflow chooses (`ray start --head` flags)
OWN_PORTS = (
    "dashboard-agent-listen-port",
    "ray-client-server-port",
    "metrics-export-port",
    "runtime-env-agent-port",
)


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free now: held open together while they are chosen, since a port
    closed at once may be handed out again by the next bind (Ray refuses one port given to two
    of its components). Ray binds them later, so another user may take one in between: Ray's
    components fail on a port they cannot bind, and the dashboard's listener is checked to be
    this user's before anything is sent to it (`wait_for_dashboard`)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def _token_file() -> str | None:
    """The token's file, mounted on every node by path (its value never enters the config)."""
    path = token_path()
    return str(path) if auth_token() is not None and path.is_file() else None


def wait_for_dashboard(url: str, timeout_s: float, what: str) -> None:
    """Until the Jobs API answers (any HTTP status: 401 without a token still means up). Each
    try first looks up who listens on the port (rayflow.security.ports): another user's process
    there is refused in one line, and nothing is sent to it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ports.url_held(url, f"{what}: the dashboard"):
                with urllib.request.urlopen(f"{url}/api/version", timeout=5):
                    return
        except urllib.error.HTTPError:
            return
        # not (yet) the dashboard: nothing there, or another server on the port (HTTP/2 bytes)
        except (urllib.error.URLError, http.client.HTTPException, OSError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(
                f"{what}: the dashboard at {url} did not answer within {timeout_s:g} s "
                "(backend.start_timeout_s)"
            )
        time.sleep(1.0)


@dataclass
class _Start:
    """One start of a vm cluster: the run that claims its name, and where its files are."""

    handle: ClusterHandle
    run_id: str
    name: str
    temp_dir: str = ""
    config_file: str = ""

    def stop_path(self, provider: str) -> str:
        """What `python -m rayflow.teardown` takes: the fake cluster's temp dir, else its cluster
        YAML."""
        return self.temp_dir if provider == "fake_multinode" else self.config_file


class VMCluster(ClusterBackend):
    submits_jobs = True
    keeps_clusters = True

    @property
    def cluster_yaml(self) -> str | None:
        """The user's own cluster YAML (backend.cluster_yaml), or None: rayflow renders one."""
        path = self.section.get("cluster_yaml")
        return str(path) if path is not None else None

    @property
    def provider(self) -> str:
        if self.cluster_yaml:  # the file's (refused in one line when it cannot be read)
            return user_file.provider_type(user_file.load(self.cluster_yaml), self.cluster_yaml)
        return str(self.section.provider)

    # The contract's class attribute, a property here: fake nodes are processes on this machine,
    # other providers' nodes other machines (mypy refuses a read-only property over an attribute).
    @property
    def shares_filesystem(self) -> bool:  # type: ignore[override]
        return self.provider == "fake_multinode"

    @property
    def single_machine(self) -> bool:  # type: ignore[override]
        return self.provider == "fake_multinode"

    @property
    def keeps_cluster(self) -> bool:
        return bool(self.section.keep_cluster)

    def gpu(self) -> bool:
        """The run uses GPUs (compute=gpu): the GPU worker type is rendered too."""
        return str(self.section.get("compute_device")) == "cuda"

    def check(self) -> None:
        check(self.section, self.gpu(), self.auth_mode)
        # a file: loaded, with rayflow's additions, checked as `ray up` would
        config = self.cluster_config()
        section = with_defaults(self.section)
        check_cluster_name(config, section)  # wherever it came from, before it names a file
        # the head's dashboard beyond loopback without auth
        check_exposure(config, section, self.auth_mode)
        if self.cluster_yaml and self.provider != "fake_multinode":
            check_tools(self.provider, "backend.cluster_yaml")

    def probe(self) -> None:
        """aws: the account can start this cluster: credentials EC2 takes, an endpoint that
        answers, the instance types offered in the region (rayflow.backends.vm.aws)."""
        if self.provider != "aws":
            return
        from rayflow.backends.vm import aws

        config = self.cluster_config()
        try:
            aws.probe(str(config["provider"]["region"]), aws.instance_types(config))
        except aws.AwsError as err:
            key = "backend.cluster_yaml" if self.cluster_yaml else "backend.provider"
            raise ConfigError(key, f"aws: {err}") from None

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        """The head and max_worker_nodes workers of the type the run uses, where sizes are set."""
        b = self.section
        if self.cluster_yaml:
            # the file's node types may leave their sizes to Ray: the running cluster says
            return None
        worker = b.worker.gpu if self.gpu() else b.worker.cpu
        if worker.num_cpus is None:
            return None  # the node's own size, known once it runs
        node = {"CPU": float(worker.num_cpus), "GPU": float(worker.num_gpus or 0)}
        if worker.memory is not None:
            node["memory"] = float(worker.memory)
        high = worker.max_workers if worker.max_workers is not None else b.max_worker_nodes
        head = {"CPU": float(b.num_cpus_head_node or 0), "GPU": float(b.num_gpus_head_node or 0)}
        return [head] + [dict(node) for _ in range(int(high))]

    def cluster_config(self, gcs_address: str | None = None) -> dict[str, Any]:
        """The cluster YAML rayflow writes and starts (`ray up`, or the fake head's autoscaling
        config): rendered from the section, or the user's file with rayflow's additions."""
        return self._config_and_notes(gcs_address)[0]

    def _config_and_notes(self, gcs_address: str | None = None) -> tuple[dict[str, Any], list[str]]:
        import ray

        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        if self.cluster_yaml:
            return render_file(
                self.section,
                self.gpu(),
                self.auth_mode,
                ray.__version__,
                python,
                _token_file(),
                gcs_address,
            )
        config = render(
            self.section,
            self.gpu(),
            self.auth_mode,
            ray.__version__,
            python,
            _token_file(),
            gcs_address,
        )
        return config, [n for n in [placeholder_note(self.section)] if n]

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        """Exactly the cluster YAML a start writes (what a dry run prints): `ray up` takes it,
        except fake_multinode's, which the `ray start --head` that rayflow runs here takes."""
        config, notes = self._config_and_notes()
        provider = config["provider"]["type"]
        head = head_args(config) if provider == "fake_multinode" else []
        mounted = "~/.ray/auth_token" in (config.get("file_mounts") or {})
        launch = launch_note(
            provider,
            launcher_env(self.section, self.auth_mode, _token_file(), provider=provider),
            head,
            mounted,
        )
        return Rendered(yaml.safe_dump(config, sort_keys=False), lambda: (*notes, launch))

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        handle = ClusterHandle(self.name, kept=self.keeps_cluster)
        run = _Start(
            handle,
            uuid.uuid4().hex,
            check_cluster_name(self.cluster_config(), with_defaults(self.section)),
        )
        handle.name, handle.owner_run = run.name, run.run_id
        with handle.unwound_on_error():
            if self.auth_mode == "token":
                ensure_token()  # one token for this client, the head and every worker
            in_place = self.provider == "fake_multinode"
            handle.address = self._start_fake(run) if in_place else self._start_with_sdk(run)
            handle.submission = Submission(
                in_place=in_place,
                python=sys.executable if in_place else "python",
                withheld=kept_ops.NODE_IDENTITY.get(self.provider, ()),
            )
        return handle

    def _teardown_is(self, run: _Start) -> None:
        """The command that stops this cluster should this process die first (printed on error
        paths)."""
        run.handle.teardown_command = f"python -m rayflow.teardown {run.stop_path(self.provider)}"

    def _kept_note(self, run: _Start) -> None:
        print(
            f"[rayflow] vm: cluster {run.name} is kept running (backend.keep_cluster=true); "
            "a later run that names it joins it; see it with `rayflow status`, stop it with "
            f"`rayflow down {run.name}`",
            flush=True,
        )

    # --- a kept cluster, from its record alone (rayflow status, down, logs) ------------------

    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        return kept_ops.reach(kept, headers)

    def down(self, kept: KeptCluster) -> None:
        provider = kept.where.get("provider", "fake_multinode")
        kept_ops.down(kept, launcher_env(self.section, self.auth_mode, _token_file(), provider))

    # --- fake_multinode: the head on this machine, worker nodes started by its autoscaler ----

    def _join_fake(self, run: _Start, kept: dict[str, Any]) -> str:
        """The dashboard URL of the kept fake cluster this run now holds (it never stops it)."""
        run.temp_dir, url = kept["temp_dir"], kept.get("url")
        self._teardown_is(run)
        run.handle.kept = run.handle.joined = True
        run.handle.owner_run = kept.get("owner_run") or run.handle.owner_run
        run.handle.where = kept_ops.where_fake(run.temp_dir, str(url or ""))
        try:
            if not url:  # the run that kept it died before its head answered
                raise ClusterError("no dashboard recorded")
            wait_for_dashboard(url, 10, "backend=vm")
        except ClusterError:
            raise ClusterError(
                f"backend=vm: the kept cluster {run.name} does not answer at {url}: stop it with "
                f"python -m rayflow.teardown {run.temp_dir}"
            ) from None
        print(
            f"[rayflow] vm: joining the kept cluster {run.name} ({mask_text(run.temp_dir)}); "
            "it keeps running after this run",
            flush=True,
        )
        self._kept_note(run)
        return str(url)

    def _register_fake_teardown(self, run: _Start) -> None:
        if not self.keeps_cluster:  # keep_cluster=true leaves it for a later run that names it
            run.handle.on_stop(
                "remove the fake cluster's temp dir",
                shutil.rmtree,
                run.temp_dir,
                ignore_errors=True,
            )
            run.handle.on_stop(
                "kill what is left of the fake cluster", kill_processes_mentioning, run.temp_dir
            )
            run.handle.on_stop(
                "stop the fake cluster's processes", stop_processes_mentioning, run.temp_dir
            )

    def _start_fake(self, run: _Start) -> str:
        # A cluster rayflow starts here is its own temp dir: one not kept is this run's alone and
        # needs no record; a kept one is recorded, so a later run that names it can join it.
        def running(kept: dict[str, Any] | None) -> bool:
            return bool(kept and kept.get("temp_dir") and pids_mentioning(kept["temp_dir"]))

        kept = state.claim(
            run.name,
            run.run_id,
            "fake_multinode",
            self.keeps_cluster,
            running,
            record_new=self.keeps_cluster,
        )
        run.handle.on_stop("let go of the cluster's name", state.release, run.name, run.run_id)
        if kept:
            return self._join_fake(run, kept)
        # a short name: Ray's socket paths in it stay < 108 chars; 0700 (mkdtemp), holding the
        # autoscaling config and Ray's own temp dir, which Ray makes 0777 (vm.owned.RAY_TEMP)
        run.temp_dir = tempfile.mkdtemp(prefix="rf-vm-")
        self._teardown_is(run)
        self._register_fake_teardown(run)
        url = self._fake_head(run)
        run.handle.where = kept_ops.where_fake(run.temp_dir, url)
        run.handle.autostop = kept_ops.autostop_fake(run.temp_dir, url)
        if self.keeps_cluster:
            state.update(run.name, run.run_id, temp_dir=run.temp_dir, url=url, stop=run.temp_dir)
            self._kept_note(run)
        return url

    def _fake_head(self, run: _Start) -> str:
        """`ray start --head` of a fake_multinode cluster in its temp dir; its dashboard URL once it
        answers."""
        from ray.util import get_node_ip_address

        port, dashboard, *others = _free_ports(6)
        config = self.cluster_config(gcs_address=f"{get_node_ip_address()}:{port}")
        run.config_file = os.path.join(run.temp_dir, "autoscaling.yaml")
        Path(run.config_file).write_text(yaml.safe_dump(config))
        command = [
            str(Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            f"--port={port}",
            f"--dashboard-port={dashboard}",
            "--dashboard-host=127.0.0.1",
            f"--temp-dir={os.path.join(run.temp_dir, owned.RAY_TEMP)}",
            *head_args(config),
            f"--autoscaling-config={run.config_file}",
            # every port of its own: other Ray clusters on this machine keep theirs
            *(f"--{flag}={free}" for flag, free in zip(OWN_PORTS, others, strict=True)),
            "--disable-usage-stats",
        ]
        env = dict(
            os.environ,
            **launcher_env(self.section, self.auth_mode, _token_file(), provider="fake_multinode"),
        )
        # jobs on this head run `python`: this venv's, as the fake nodes do
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        # Ray processes asking the state API with no address (Ray Train's placement-group
        # cleaner) would ask the machine's latest cluster, not this one (see backends/local.py)
        env["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard}"
        timeout = float(self.section.start_timeout_s)
        with phase(f"starting a fake_multinode head in {run.temp_dir} (ray start --head)", "vm"):
            try:
                subprocess.run(
                    command,
                    env=env,
                    check=True,
                    timeout=timeout,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            except subprocess.CalledProcessError as err:
                last = (err.stderr or "").strip().splitlines()[-1:] or [
                    f"exit code {err.returncode}"
                ]
                raise ClusterError(
                    f"backend=vm: ray start --head failed: {mask_text(last[0])}"
                ) from None
        url = f"http://127.0.0.1:{dashboard}"
        with phase(f"waiting for the head's dashboard at {url}", "vm"):
            wait_for_dashboard(url, timeout, "backend=vm")
        return url

    # --- local, aws, gcp: Ray's cluster launcher ---------------------------------------------

    def _start_with_sdk(self, run: _Start) -> str:
        if not self.cluster_yaml:
            require_filled(self.section)
        config = self.cluster_config()
        # Cloud and host clusters are found by name (tags, Ray's cluster-NAME.state): one is
        # joined only when a run of this user kept it and none holds it, else refused; on a
        # cloud, so is any VM of the name that is not that kept cluster's (vm.owner).
        kept = state.claim(
            run.name,
            run.run_id,
            self.provider,
            self.keeps_cluster,
            lambda recorded: self._running(config, recorded),
        )
        run.handle.on_stop("let go of the cluster's name", state.release, run.name, run.run_id)
        if kept:
            run.handle.owner_run = kept.get("owner_run") or run.handle.owner_run
        if self.provider in owner.TAGGED:  # every VM it makes carries the cluster's owner
            config = owner.tag(config, str(run.handle.owner_run))
        self._config_file(run, config, kept)
        self._ray_up(run, bool(kept))
        run.handle.where = kept_ops.where_sdk(self.provider, run.config_file)
        run.handle.autostop = kept_ops.autostop_sdk(
            self.provider, dashboard_port(config), str(run.handle.owner_run)
        )
        if kept or self.keeps_cluster:
            run.handle.kept, run.handle.joined = True, bool(kept)
            self._kept_note(run)
        return self._tunnel(run.handle, config, self._head_ip(run, config))

    def _running(self, config: dict[str, Any], recorded: dict[str, Any] | None) -> bool:
        """Whether a head of this cluster's name runs (the provider's own view); on a cloud,
        refused in one line while a VM of the name runs that the kept cluster of `recorded`
        did not start (vm.owner)."""
        if self.provider in owner.TAGGED:
            stop = (recorded or {}).get("stop")
            hint = f", or stop yours: python -m rayflow.teardown {stop}" if stop else ""
            return owner.check_name_free(config, recorded, hint)
        if self.provider == "local":  # Ray reads and writes it in /tmp/ray, a folder anyone writes
            why = owned.ray_local_state_problem(str(config["cluster_name"]))
            if why:
                raise ConfigError("backend.cluster_name", f"{why}: give this run a name of its own")
        return _head_running(config)

    def _head_ip(self, run: _Start, config: dict[str, Any]) -> str:
        """The head the tunnel goes to: on a cloud, the one VM of the name that carries the
        cluster's owner tag, never another party's of the same name."""
        from ray.autoscaler import sdk

        if self.provider not in owner.TAGGED:
            return str(sdk.get_head_node_ip(run.config_file))
        ip = owner.head_ip(config, str(run.handle.owner_run))
        if ip is None:
            raise ClusterError(
                f"backend=vm provider={self.provider}: `ray up` finished, yet no head VM of "
                f"cluster {run.name} carries its owner tag ({owner.OWNER_TAG})"
            )
        return ip

    def _config_file(
        self, run: _Start, config: dict[str, Any], kept: dict[str, Any] | None
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
        self._teardown_is(run)
        # the teardown command names this file, and a later run's refusal names that command
        state.update(run.name, run.run_id, stop=run.config_file)
        if kept or self.keeps_cluster:
            return
        run.handle.on_stop(
            "remove the cluster config's folder", owned.remove_folder, run.config_file
        )
        if self.provider in owner.TAGGED:
            return
        if self.provider == "local":
            run.handle.on_stop(
                "stop Ray on the worker hosts (ray down stops only the head)",
                stop_local_workers,
                config,
            )
        run.handle.on_stop(f"tear down cluster {run.name}", _ray_down, run.config_file)

    def _ray_up(self, run: _Start, kept: bool) -> None:
        """`ray up` through Ray's SDK; it never restarts Ray on a running cluster: one this run did
        not start is only ever a kept one it joins (`--no-restart`)."""
        import click  # Ray's launcher reports its failures as click exceptions
        from ray.autoscaler import sdk

        # v1 for local (ray#59905)
        env = launcher_env(self.section, self.auth_mode, _token_file(), provider=self.provider)
        what = (
            f"joining the kept cluster {run.name} (as `ray up --no-restart`)"
            if kept
            else f"creating cluster {run.name} (provider {self.provider}, as `ray up`)"
        )

        def up() -> None:
            sdk.create_or_update_cluster(
                run.config_file, no_restart=kept, restart_only=False, no_config_cache=True
            )

        with scoped_env(env), launcher_output(), phase(what, "vm"):
            try:
                if self.provider in CLOUDS and not kept:  # VMs: an end, and a search by tags
                    self._launch_vms(run, up)
                else:
                    up()
            # Ray's launcher aborts with one (a host it cannot reach, a setup command that failed)
            except click.ClickException as err:
                raise ClusterError(
                    f"backend=vm provider={self.provider}: `ray up` failed: "
                    f"{mask_text(err.format_message() or 'see its output above')}"
                ) from None

    def _launch_vms(self, run: _Start, up: Callable[[], None]) -> None:
        """`ray up` of a cloud cluster, in a thread waited for at most start_timeout_s; the undo
        that terminates every VM of the cluster (by its tags) is registered first, and a kept
        one's applies only where the start did not finish (rayflow.backends.vm.cloud_up)."""
        handed = cloud_up.Launch(run.name)
        config = yaml.safe_load(Path(run.config_file).read_text())
        if self.keeps_cluster:
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
        timeout = float(self.section.start_timeout_s)
        cloud_up.launch(up, run.name, timeout, handed, f"backend=vm provider={self.provider}")

    def _tunnel(self, handle: ClusterHandle, config: dict[str, Any], head_ip: str) -> str:
        """The head's dashboard through an SSH tunnel to its loopback (vm.tunnel), stopped with the
        run."""
        cluster = str(config.get("cluster_name", "default"))
        if self.provider in CLOUDS and not handle.joined:
            # new VMs, whose addresses earlier ones of the name may have had: pinned afresh
            ssh.forget_hosts(cluster)
        opened, url = tunnel.open_tunnel(
            tunnel.ssh_auth(config), head_ip, dashboard_port(config), cluster
        )
        handle.on_stop("close the SSH tunnel to the head's dashboard", tunnel.close_tunnel, opened)
        deadline = time.monotonic() + float(self.section.start_timeout_s)
        with phase(
            f"waiting for the head's dashboard through an SSH tunnel to {head_ip} ({url})", "vm"
        ):
            while True:
                failed = tunnel.tunnel_failed(opened)
                if failed:
                    raise failed
                try:
                    wait_for_dashboard(url, 2, f"backend=vm provider={self.provider}")
                    return str(url)
                except ClusterError:
                    if time.monotonic() > deadline:
                        raise


def _head_running(config: dict) -> bool:
    """Whether the provider knows a live head of this cluster's name (Ray's own view: cloud tags,
    the local provider's cluster-NAME.state)."""
    from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND

    provider = internals.node_provider(config["provider"], config["cluster_name"])
    return bool(provider.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD}))


__all__ = ["VMCluster"]


def _ray_down(config_file: str) -> None:
    """`ray down` through Ray's SDK, printing as `ray up` did (launcher_output)."""
    from ray.autoscaler import sdk

    with launcher_output():
        sdk.teardown_cluster(config_file)
