"""backend=vm provider=local: your own hosts, reached over SSH by Ray's launcher.

What differs here: the hosts are the cluster's one node type (Ray refuses node types for it), and
only you can name them and the SSH user and key; the head's `ray start` names its address (Ray
finds no route on such hosts) and workers say their resources; the hosts have Ray already (its
version checked, never installed); `ray up` runs autoscaler v1 (ray#59905). Ray's own record of
the cluster is a file in /tmp/ray, which anyone may write: trusted only when it is this user's.
The head's address is the file's, and the cluster is stopped by `ray stop` over SSH on each host
(rayflow.backends.vm.kept.stop_local_workers), the head last.
"""

from __future__ import annotations

import functools
import os
import shlex
import subprocess
from collections.abc import Mapping
from typing import Any

from rayflow.backends.vm import internals, owned
from rayflow.backends.vm.commands import start_commands
from rayflow.backends.vm.defaults import placeholder
from rayflow.backends.vm.providers.base import NODE_RESOURCES, Provider, Step, Stop, refuse
from rayflow.errors import ClusterError, ConfigError
from rayflow.schema.kinds import KeyedError


class Local(Provider):
    hosts = True
    autoscaler = "v1"
    keys = frozenset({"head_ip", "worker_ips", "ssh_user", "ssh_private_key"})
    user_keys = ("head_ip", "worker_ips", "ssh_user", "ssh_private_key")

    def check(self, b: dict) -> None:
        """Enough hosts for max_worker_nodes, and the head not among the workers."""
        workers, high = b["worker_ips"], b["max_worker_nodes"]
        if workers is None:
            return
        if b["head_ip"] in workers:
            raise KeyedError("worker_ips", "lists the head (backend.head_ip) as a worker")
        if workers and high > len(workers):
            raise KeyedError(
                "max_worker_nodes",
                f"({high}) is more than the {len(workers)} hosts in backend.worker_ips",
            )

    file_keys = (("head_ip", "fill in the head host's address"),)

    def check_file(self, doc: Mapping, path: str) -> None:
        if not isinstance(doc["provider"].get("worker_ips"), list):
            raise refuse(
                path,
                "provider.worker_ips",
                "missing: list the worker hosts (an empty list: the head alone)",
            )

    def render(self, b: dict, gpu: bool, gcs_address: str | None = None) -> dict[str, Any]:
        # Ray refuses node types for local: the hosts are its one type
        return {
            "provider": {
                "type": self.name,
                "head_ip": b.get("head_ip") or placeholder("head_ip"),
                "worker_ips": list(b.get("worker_ips") or [placeholder("worker_ips")]),
            },
            "auth": {
                "ssh_user": b.get("ssh_user") or placeholder("ssh_user"),
                "ssh_private_key": b.get("ssh_private_key") or placeholder("ssh_private_key"),
            },
        }

    def setup_commands(self, ray_version: str) -> dict[str, list[str]]:
        # Your hosts, maybe without internet: check the versions instead of installing.
        check = (
            f"test \"$(python -c 'import ray; print(ray.__version__)')\" = {ray_version} || "
            f'{{ echo "rayflow: this host needs ray {ray_version}, as the launcher: '
            f'pip install -U \\"ray[default,tune]=={ray_version}\\"" >&2; exit 1; }}'
        )
        return {"setup_commands": [check], "head_setup_commands": [], "worker_setup_commands": []}

    def start_commands(self, b: dict, gpu: bool, auth_mode: str) -> dict[str, list[str]]:
        # Without --node-ip-address Ray finds no route on such hosts and advertises 127.0.0.1;
        # hosts you run: no ulimit raise that may need privileges
        head_ip = shlex.quote(str(b.get("head_ip") or placeholder("head_ip")))
        worker_ip = "--node-ip-address=$(hostname -I | cut -d' ' -f1)"
        head, workers = start_commands(
            b,
            auth_mode,
            head_extra=[f"--node-ip-address={head_ip}"],
            worker_extra=[worker_ip, *_worker_args(b, gpu)],
        )
        return {"head_start_ray_commands": head, "worker_start_ray_commands": workers}

    def launcher_env(self, auth_mode: str, token_file: str | None = None) -> dict[str, str]:
        env = super().launcher_env(auth_mode, token_file)
        # Autoscaler v2 loses fresh local-provider hosts (Ray 2.60, ray#59905): `ray up` runs v1.
        env["RAY_UP_enable_autoscaler_v2"] = "0"
        return env

    def running(self, config: dict[str, Any], recorded: dict[str, Any] | None) -> bool | None:
        # Ray reads and writes its record in /tmp/ray, a folder anyone writes
        why = ray_state_problem(str(config["cluster_name"]))
        if why:
            raise ConfigError("backend.cluster_name", f"{why}: give this run a name of its own")
        return None

    def head_ip(self, config: dict[str, Any], owner: str | None) -> str | None:
        """The file's (Ray's provider state in /tmp may be gone, or not this user's)."""
        settings = config["provider"]
        return str(settings.get("external_head_ip") or settings["head_ip"])

    def stop_steps(self, stop: Stop) -> list[Step]:
        """From this machine: `ray stop` on every host, the head last, then Ray's record of them
        marked stopped. From the head: on each worker, then on the head itself, which stops even
        where a worker could not be reached."""
        if stop.on_head:
            return [
                ("stop Ray on the worker hosts", functools.partial(_stop_workers, stop.config)),
                (
                    "stop Ray on the head",
                    functools.partial(subprocess.run, ["ray", "stop"], timeout=300, check=False),
                ),
            ]
        return [
            ("stop Ray on every host", functools.partial(_stop_hosts, stop.config)),
            ("mark Ray's record of the hosts stopped", functools.partial(_forget, stop.config)),
        ]


def _worker_args(b: dict, gpu: bool) -> list[str]:
    t = b["worker"]["gpu" if gpu else "cpu"]
    return [f"{flag}={int(t[key])}" for key, _, flag in NODE_RESOURCES if t.get(key) is not None]


def ray_state_problem(name: str) -> str | None:
    """Why Ray's own record of an SSH-hosts cluster of this name, which its local node provider
    reads and writes in Ray's temp dir (/tmp/ray/cluster-NAME.state, a folder anyone may write),
    is not this user's to trust; None when it is, or is not there."""
    why = owned.problem(internals.local_state_path(name), folder=False)
    return f"Ray's record of the SSH-hosts cluster {name}: {why}" if why else None


def _stop_workers(config: dict[str, Any]) -> None:
    """From the head: its auth names the key the launcher copied there; the hosts' keys are
    pinned per cluster in the head user's own cache (rayflow.security.ssh)."""
    from rayflow.backends.vm import kept  # its SSH stop: what `rayflow down` runs too

    try:
        kept.stop_local_workers(config)
    except ClusterError as err:  # a worker address that is not a host: never passed to ssh
        print(f"[autostop] {err}", flush=True)


def _stop_hosts(config: dict[str, Any]) -> None:
    """`ray stop` over SSH on every host, the head last (Ray's own teardown finds the head
    through its provider's state in /tmp, which a reboot or a tmp cleaner removes)."""
    from rayflow.backends.vm import kept

    settings = config["provider"]
    hosts = {**settings, "worker_ips": [*(settings.get("worker_ips") or []), settings["head_ip"]]}
    unreached = kept.stop_local_workers({**config, "provider": hosts}) or []
    if unreached:
        raise ClusterError(
            f"cluster {config['cluster_name']}: SSH did not reach {', '.join(unreached)}: Ray may "
            "still run there; run `ray stop` on those hosts by hand"
        )


def _forget(config: dict[str, Any]) -> None:
    """Ray's record of the hosts, if still there and this user's, marked stopped."""
    name = config["cluster_name"]
    if os.path.lexists(internals.local_state_path(name)) and ray_state_problem(name) is None:
        provider = internals.node_provider(config["provider"], name)
        provider.terminate_nodes(provider.non_terminated_nodes({}))


PROVIDER = Local("local")
