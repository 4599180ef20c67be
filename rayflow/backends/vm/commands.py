"""backend=vm: what runs on the nodes, and what the launcher runs under, the same for every
provider (each provider's own part: rayflow.backends.vm.providers).

`start_commands` (`ray start` on head and workers, with what a provider adds), `head_start_args`
(the head's resources as `ray start` arguments; `head_args`: from a cluster YAML's head node type),
`pin_command` (this machine's versions of Ray and rayflow's runtime dependencies),
`private_token_setup`, `dashboard_host` and `dashboard_port`, `launcher_output` (what Ray's
launcher prints) and `launch_note` (how to start a dry run's file yourself).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping

from omegaconf import DictConfig

from rayflow.backends.vm import internals
from rayflow.backends.vm.defaults import with_defaults
from rayflow.runtime.requirements import runtime_requirements
from rayflow.security.auth import NODE_TOKEN_MODES

DASHBOARD_PORT = 8265  # Ray's default, on the head of a launched cluster


def _auth_env(auth_mode: str) -> str:
    # Every node exports the mode before `ray start`: a head finding a token file turns auth
    # on by itself, a worker does not, and the two must agree.
    return f"export RAY_AUTH_MODE={auth_mode};"


def dashboard_host(b: Mapping, auth_mode: str) -> str:
    if b.get("dashboard_host"):
        return str(b["dashboard_host"])
    # The head's loopback only: rayflow reaches it through an SSH tunnel, as `ray dashboard`
    # does, so the token never crosses the network in clear (vm.tunnel).
    return "127.0.0.1"


def head_start_args(section: DictConfig | Mapping) -> list[str]:
    """The head's resources as `ray start` arguments: they must match the head node type of
    the rendered config (fake_multinode: the launcher runs `ray start --head` itself)."""
    b = with_defaults(section)
    return [
        f"--num-cpus={int(b['num_cpus_head_node'])}",
        f"--num-gpus={int(b['num_gpus_head_node'])}",
    ]


def start_commands(
    b: Mapping,
    auth_mode: str,
    prefix: str = "",
    head_extra: Iterable[str] = (),
    worker_extra: Iterable[str] = (),
) -> tuple[list[str], list[str]]:
    """`ray stop`, then `ray start` on the head and on the workers, the auth mode exported before
    it (and `prefix` after that), with what the provider adds to each."""
    head = [
        "ray start --head --port=6379 --object-manager-port=8076",
        "--autoscaling-config=~/ray_bootstrap_config.yaml",
        *head_start_args(b),
        f"--dashboard-host={dashboard_host(b, auth_mode)}",
        *head_extra,
    ]
    worker = ["ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076", *worker_extra]
    lead = f"{_auth_env(auth_mode)}{prefix}"
    return (
        ["ray stop", f"{lead} {' '.join(head)}"],
        ["ray stop", f"{lead} {' '.join(worker)}"],
    )


def private_token_setup(doc: dict) -> dict:
    """With the token mounted (`file_mounts`), NODE_TOKEN_MODES first of every node's setup, once
    however often applied: Ray's launcher syncs the mounts before the setup commands, and rsync
    keeps this machine's mode and leaves `~/.ray` 0755. Applied last, so overrides keep it too."""
    mounts = doc.get("file_mounts")
    if isinstance(mounts, Mapping) and "~/.ray/auth_token" in mounts:
        rest = [c for c in doc.get("setup_commands") or [] if c != NODE_TOKEN_MODES]
        doc["setup_commands"] = [NODE_TOKEN_MODES, *rest]
    return doc


def pin_command(ray_version: str) -> str:
    """The install of Ray and rayflow's runtime dependencies at this machine's versions."""
    return "pip install -U " + " ".join(f'"{pin}"' for pin in runtime_requirements(ray_version))


def launch_note(
    provider: str,
    env: Mapping[str, str],
    head_args: list[str],
    token_mounted: bool = False,
    in_place: bool = False,
) -> str:
    """The one line a dry run prints on its provider and how to start the printed cluster YAML
    without rayflow. token_mounted: the file's `file_mounts` names this machine's token file;
    in_place: the provider's head is started by rayflow here (`ray start --head`), not `ray up`."""
    prefix = " ".join(f"{k}={v}" for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH")
    # `ray up` would run prepare_config, which needs an example.yaml the wheel lacks
    if in_place:
        return (
            f"rayflow: dry run: provider: {provider} (started by rayflow on this machine; "
            "not a file for ray up: try backend.provider=aws, gcp or local); "
            f"to start it yourself: {prefix} ray start --head "
            f"--autoscaling-config=cluster.yaml {' '.join(head_args)} --dashboard-host=127.0.0.1"
        )
    # File paths are no secrets: the token file's and auth.ssh_private_key print as they are, so
    # `ray up` on this machine finds them; the token's value never enters the document.
    mounted = (
        "; file_mounts names this machine's token file by its path (the token is not in the file)"
        if token_mounted
        else ""
    )
    return (
        f"rayflow: dry run: provider: {provider} (a file for ray up); "
        f"to start it yourself: {prefix} ray up cluster.yaml{mounted}"
    )


def head_args(config: dict) -> list[str]:
    """The head node type's resources as `ray start --head` arguments (a fake_multinode head is
    started by rayflow, not by the launcher, and must match its node type)."""
    resources = dict(
        config["available_node_types"][config["head_node_type"]].get("resources") or {}
    )
    args = [
        f"{flag}={int(resources.pop(key))}"
        for key, flag in (
            ("CPU", "--num-cpus"),
            ("GPU", "--num-gpus"),
            ("memory", "--memory"),
            ("object_store_memory", "--object-store-memory"),
        )
        if key in resources
    ]
    return args + (
        [f"--resources={json.dumps(resources, separators=(',', ':'))}"] if resources else []
    )


def dashboard_port(config: dict) -> int:
    """The head's dashboard port: its `ray start --head --dashboard-port`, else Ray's default."""
    for command in config.get("head_start_ray_commands") or []:
        found = (
            re.search(r"--dashboard-port[= ](\d+)", command)
            if isinstance(command, str) and "--head" in command
            else None
        )
        if found:
            return int(found.group(1))
    return DASHBOARD_PORT


@contextlib.contextmanager
def launcher_output() -> Iterator[None]:
    """What Ray's launcher prints in this process while it runs (its `cli_logger`, one object for
    the whole process) as `ray up` prints it on a terminal: its messages without its verbose
    lines (`ray up -v`). On a terminal in Ray's own style; elsewhere (a pipe, a CI log, a
    notebook) one plain record per message, no colour codes, where Ray's default would colour
    them whatever the stream and print its verbose lines too. Put back afterwards."""
    import sys

    import colorful  # what Ray's cli_logger colours with (its `cf` proxies it)

    cli_logger = internals.launcher_logger()
    saved = dict(vars(cli_logger))
    colours = colorful.colorful.colormode  # the module's own attribute would not reach it
    terminal = sys.stdout.isatty()
    cli_logger.configure(
        log_style="auto" if terminal else "record",
        color_mode="auto" if terminal else "false",
        verbosity=0,
    )
    try:
        yield
    finally:
        vars(cli_logger).update(saved)
        colorful.colorful.colormode = colours
