"""backend=vm: a Ray cluster from Ray's cluster launcher, running the workload as a Ray Job.

`fake_multinode` (the default) is Ray's real autoscaler launching worker nodes as processes
on this machine: rayflow starts the head itself (`RAY_FAKE_CLUSTER=1 ray start --head` with
an autoscaling config it writes completely) in a temp dir of its own, and stops exactly the
processes that name it. `local` (SSH hosts), `aws` and `gcp` go through Ray's SDK
(`create_or_update_cluster`, `teardown_cluster`), the library behind `ray up`/`ray down`.
The run itself is submitted to the head (rayflow.orchestrator.submission); nothing connects this
driver. A head on another machine is reached through an SSH tunnel to its loopback (vm.tunnel).
Its two ways of starting are vm.fake_start and vm.sdk_start; vm.start holds what they share, and
what differs by provider is the provider's (vm.providers).
With `backend.cluster_yaml` the user's own cluster YAML is the cluster (vm.user_file,
vm.user_additions), started the same way by its provider.

Clusters have owners (vm.state): a run tears down only the cluster it started and did not keep;
it joins a cluster of its name only when that cluster was kept and no live run holds it, and is
refused in one line otherwise. The SDK providers never run `ray up` over a live cluster this run
did not start, and join a kept one with `no_restart=True`.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import yaml

from rayflow.backends.base import ClusterBackend, KeepsClusters, Rendered, Traits, WorkerPreload
from rayflow.backends.handle import ClusterHandle, Submission
from rayflow.backends.kept import KeptCluster
from rayflow.backends.vm import fake_start, providers, sdk_start, user_file
from rayflow.backends.vm import kept as vm_kept
from rayflow.backends.vm.checks import (
    check,
    check_cluster_name,
    check_exposure,
    check_tools,
    placeholder_note,
)
from rayflow.backends.vm.commands import head_args, launch_note
from rayflow.backends.vm.config import launcher_env, render
from rayflow.backends.vm.defaults import with_defaults
from rayflow.backends.vm.rules import shipped_defaults
from rayflow.backends.vm.start import Start, token_file
from rayflow.backends.vm.user_additions import render_file
from rayflow.errors import ConfigError
from rayflow.security.auth import ensure_token


class VMCluster(ClusterBackend, KeepsClusters):
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

    # A property here: fake nodes are processes on this machine, other providers' nodes other
    # machines (mypy refuses a read-only property over an attribute).
    @property
    def traits(self) -> Traits:  # type: ignore[override]
        fake = providers.get(self.provider).in_place
        return Traits(submits_jobs=True, shares_filesystem=fake, single_machine=fake)

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
        if self.cluster_yaml and not providers.get(self.provider).in_place:
            check_tools(self.provider, "backend.cluster_yaml")

    def probe(self) -> None:
        """The account can start this cluster, as its provider asks its cloud (aws: credentials
        EC2 takes, an endpoint that answers, the instance types offered in the region)."""
        why = providers.get(self.provider).probe(self.cluster_config)
        if why:
            key = "backend.cluster_yaml" if self.cluster_yaml else "backend.provider"
            raise ConfigError(key, f"{self.provider}: {why}")

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
                token_file(),
                gcs_address,
            )
        config = render(
            self.section,
            self.gpu(),
            self.auth_mode,
            ray.__version__,
            python,
            token_file(),
            gcs_address,
        )
        return config, [n for n in [placeholder_note(self.section)] if n]

    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        """Exactly the cluster YAML a start writes (what a dry run prints): `ray up` takes it,
        except fake_multinode's, which the `ray start --head` that rayflow runs here takes."""
        config, notes = self._config_and_notes()
        provider = config["provider"]["type"]
        in_place = providers.get(provider).in_place
        head = head_args(config) if in_place else []
        mounted = "~/.ray/auth_token" in (config.get("file_mounts") or {})
        launch = launch_note(
            provider,
            launcher_env(self.section, self.auth_mode, token_file(), provider=provider),
            head,
            mounted,
            in_place,
        )
        return Rendered(yaml.safe_dump(config, sort_keys=False), lambda: (*notes, launch))

    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        handle = ClusterHandle(self.name, kept=self.keeps_cluster)
        run = Start(
            handle,
            uuid.uuid4().hex,
            check_cluster_name(self.cluster_config(), with_defaults(self.section)),
        )
        handle.name, handle.owner_run = run.name, run.run_id
        with handle.unwound_on_error():
            if self.auth_mode == "token":
                ensure_token()  # one token for this client, the head and every worker
            in_place = providers.get(self.provider).in_place
            way = fake_start if in_place else sdk_start
            handle.address = way.start(self, run)
            handle.submission = Submission(
                in_place=in_place,
                python=sys.executable if in_place else "python",
                withheld=vm_kept.NODE_IDENTITY.get(self.provider, ()),
            )
        return handle

    # --- a kept cluster, from its record alone (rayflow status, down, logs) ------------------

    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        return vm_kept.reach(kept, headers)

    def down(self, kept: KeptCluster) -> None:
        # a record without one is of the default provider's
        provider = kept.where.get("provider", shipped_defaults()["provider"])
        vm_kept.down(kept, launcher_env(self.section, self.auth_mode, token_file(), provider))


__all__ = ["VMCluster"]
