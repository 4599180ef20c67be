"""backend=vm: `Provider`, what a provider of Ray's cluster launcher is to rayflow, and what every
provider does unless its own module (rayflow.backends.vm.providers) says otherwise.

Where the vm modules would otherwise ask for a provider's name, they ask its `Provider`: who it is
(`in_place`, `hosts`, `tagged`: the three kinds of cluster rayflow starts differently), which of
the `backend:` section's keys apply to it and its rules on them (`check`, `check_node_type`), what
a start from this machine needs (`check_here`), what only the user can fill in (`placeholders`,
`file_keys`, `check_file`), its part of the cluster YAML (`render`, `setup_commands`,
`start_commands`) and of the launcher's environment (`launcher_env`), what it asks its cloud
before a start (`fill_resources`, `probe`), how a cluster of its name is found and its head
reached (`running`, `head_ip`, the owner tag in a node's config: `tag_node`, `node_owner`), and
how its nodes are stopped: `stop_steps`, run by `terminate`, the one way for a run's teardown,
`rayflow down`, `python -m rayflow.backends.vm.teardown` and the autostop watcher on the head
(`Stop` says which).

This class itself is the whole of a provider rayflow starts only from a user's own file (azure):
Ray's launcher does everything there, its own defaults included.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayflow.backends.vm import internals
from rayflow.backends.vm.commands import launcher_output, pin_command, start_commands
from rayflow.backends.vm.defaults import HEAD_TYPE, WORKER_TYPES
from rayflow.backends.vm.rules import node_type_bounds, rendered_kinds
from rayflow.errors import ConfigError

FILE_KEY = "backend.cluster_yaml"
# what one step of a stop does, and the step (a run's teardown runs each even where one fails)
Step = tuple[str, Callable[[], object]]


def refuse(path: str, where: str, message: str) -> ConfigError:
    """A user's cluster YAML refused, naming the file and the key inside it."""
    return ConfigError(FILE_KEY, f"{path}: {where}: {message}" if where else f"{path}: {message}")


def _idle() -> bool:
    return False


@dataclass(frozen=True)
class Stop:
    """A cluster to stop, as its stop finds it: the folder or file rayflow keeps it by (a
    fake_multinode cluster's temp dir, or the cluster YAML in this user's cache, found to be this
    user's own by the caller), the cluster YAML (on the head: the copy Ray's launcher left there),
    the owner tag its VMs carry, and whether the stop runs on the head itself (the autostop
    watcher). A start cut short (rayflow.backends.vm.cloud_up) says whether `ray up` had finished
    and whether a create call is in flight (`busy`)."""

    path: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    owner: str = ""
    on_head: bool = False
    came_up: bool = True
    busy: Callable[[], bool] = _idle


class Provider:
    """A provider of Ray's cluster launcher (`provider.type` of a cluster YAML)."""

    # its nodes are processes of this machine: rayflow starts the head itself, no `ray up`, no SSH
    in_place = False
    # your own hosts over SSH: they are its one node type, Ray is on them already (checked, never
    # installed), and `ray stop` over SSH stops them
    hosts = False
    # VMs that carry the owner tag of the run that started them (rayflow.backends.vm.owner), made
    # by a `ray up` with an end (rayflow.backends.vm.cloud_up)
    tagged = False
    # `ray up` fills its node types' `resources` from the cloud's API before it validates
    fills_resources = False
    autoscaler = "v2"  # Ray's autoscaler its head runs (metadata.rayflow.autoscaler)
    head_type = HEAD_TYPE  # the head's node type in the cluster YAML rayflow renders
    keys: frozenset[str] = frozenset()  # its keys of those only some providers take
    node_type_keys: frozenset[str] = frozenset()  # the same of a node type's keys
    user_keys: tuple[str, ...] = ()  # what only the user can fill in, in that order
    # the same of its `provider:` section in a user's own file, each with what to fill in
    file_keys: tuple[tuple[str, str], ...] = ()
    # this machine's variables a job on its nodes is not handed: the nodes have an identity
    withheld: tuple[str, ...] = ()

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<provider {self.name}>"

    # --- checks ----------------------------------------------------------------------------------

    def check(self, b: dict) -> None:
        """Its rules on the validated section `b`, beyond which keys apply to it (KeyedError)."""

    def check_node_type(self, b: dict, kind: str) -> None:
        """Its rules on the node type `kind` ("cpu", "gpu") of `b`, before the general ones."""

    def check_here(self, b: dict) -> None:
        """What a start of the section `b` needs of this machine beyond `ssh` and `rsync`."""

    def placeholders(self, b: Mapping) -> list[str]:
        """The keys only the user can fill in that are still unset, in the order to fill them."""
        return [f"backend.{key}" for key in self.user_keys if b.get(key) in (None, "", [])]

    def check_file(self, doc: Mapping, path: str) -> None:
        """Its rules on a user's own cluster YAML `doc`, after its `file_keys` are filled in."""

    # --- defaults: its part of the cluster YAML -----------------------------------------------

    def render(self, b: dict, gpu: bool, gcs_address: str | None = None) -> dict[str, Any]:
        """Its keys of the cluster YAML rendered from the section `b`: `provider`, `auth` and the
        node types (the head, and the worker kinds the run uses: GPU too with `gpu`)."""
        return {
            "provider": self._section(b, gcs_address),
            "auth": self._auth(b),
            **self._node_types(b, gpu),
        }

    def _section(self, b: dict, gcs_address: str | None) -> dict[str, Any]:
        return {"type": self.name}

    def _auth(self, b: dict) -> dict[str, Any]:
        return {}

    def _node_config(self, b: dict, kind: str) -> dict[str, Any]:
        """The launch settings of the head ("head") or a worker kind ("cpu", "gpu")."""
        return {}

    def _node_types(self, b: dict, gpu: bool) -> dict[str, Any]:
        head = {
            "resources": {"CPU": int(b["num_cpus_head_node"]), "GPU": int(b["num_gpus_head_node"])},
            "node_config": self._node_config(b, "head"),
            "min_workers": 0,
            "max_workers": 0,
        }
        types = {self.head_type: head}
        for kind in rendered_kinds(gpu):
            low, high = node_type_bounds(b, kind, gpu)
            types[WORKER_TYPES[kind]] = {
                "resources": _resources(b["worker"][kind]),
                "node_config": self._node_config(b, kind),
                "min_workers": low,
                "max_workers": high,
            }
        return {"available_node_types": types, "head_node_type": self.head_type}

    def setup_commands(self, ray_version: str) -> dict[str, list[str]]:
        """The nodes' setup: Ray's defaults for it, with this machine's versions where they
        install Ray's nightly wheel."""
        ours = [
            pin_command(ray_version) if "pip install" in c and "ray" in c else c
            for c in internals.provider_defaults(self.name)["setup_commands"]
        ]
        return {"setup_commands": ours, "head_setup_commands": [], "worker_setup_commands": []}

    def start_commands(self, b: dict, gpu: bool, auth_mode: str) -> dict[str, list[str]]:
        """`ray start` on the head and the workers: VMs, whose resources reach `ray start` from
        their node type (RAY_OVERRIDE_RESOURCES)."""
        head, workers = start_commands(b, auth_mode, " ulimit -n 65536;")
        return {"head_start_ray_commands": head, "worker_start_ray_commands": workers}

    def launcher_env(self, auth_mode: str, token_file: str | None = None) -> dict[str, str]:
        """The environment of the process that starts its cluster, over this process's own."""
        return {"RAY_AUTH_MODE": str(auth_mode)}

    # --- what its cloud is asked before a start ---------------------------------------------

    def fill_resources(self, doc: dict, path: str) -> str | None:
        """A user's file's node types given the `resources` `ray up` fills in from the cloud, in
        place; the note a dry run prints where the API was not asked, else None."""
        return None

    def probe(self, config_of: Callable[[], dict[str, Any]]) -> str | None:
        """Why the account cannot start the cluster of `config_of()` (one bounded call), or None."""
        return None

    # --- its cluster by name, and its head ------------------------------------------------------

    def running(self, config: dict[str, Any], recorded: dict[str, Any] | None) -> bool | None:
        """Whether a cluster of the config's name runs, as its provider sees it; None where Ray's
        view (a live head of the name) says it. May refuse the name in one line (ConfigError)."""
        return None

    def head_ip(self, config: dict[str, Any], owner: str | None) -> str | None:
        """The address the tunnel to the head goes to: Ray's (RuntimeError where it knows no
        head of the name)."""
        from ray.autoscaler import sdk

        return str(sdk.get_head_node_ip(config))

    def tag_node(self, node_config: dict[str, Any], owner: str) -> None:
        """A node type's launch settings made to carry the owner tag (`tagged` providers)."""

    def node_owner(self, node_config: Mapping[str, Any]) -> str | None:
        """The owner tag a node type's launch settings carry, or None."""
        return None

    # --- its nodes stopped ----------------------------------------------------------------------

    def stop_steps(self, stop: Stop) -> list[Step]:
        """How its nodes are stopped, step by step: `ray down` of the cluster YAML. On the head,
        nothing: rayflow selects only VMs carrying its owner tag, which it gives none of these."""
        if stop.on_head:
            line = f"[autostop] provider {self.name}: its VMs carry no owner tag: none terminated"
            return [("say none is terminated", functools.partial(print, line, flush=True))]
        name = stop.config.get("cluster_name", "default")
        return [(f"tear down cluster {name}", functools.partial(ray_down, stop.config))]

    def terminate(self, stop: Stop) -> None:
        """Stop its nodes: every step of `stop_steps`, in order, the first failure raised."""
        for _what, step in self.stop_steps(stop):
            step()


def ray_down(config: dict[str, Any] | str) -> None:
    """`ray down` of a cluster YAML (its content or its path) through Ray's SDK, printing as
    `ray up` did (launcher_output)."""
    from ray.autoscaler import sdk

    with launcher_output():
        sdk.teardown_cluster(config)


# A node type's resource keys: the name Ray's resources give each, and `ray start`'s flag for it
NODE_RESOURCES = (
    ("num_cpus", "CPU", "--num-cpus"),
    ("num_gpus", "GPU", "--num-gpus"),
    ("memory", "memory", "--memory"),
    ("object_store_memory", "object_store_memory", "--object-store-memory"),
)


def _resources(t: dict) -> dict[str, int]:
    return {name: int(t[key]) for key, name, _ in NODE_RESOURCES if t.get(key) is not None}
