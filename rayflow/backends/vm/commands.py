"""backend=vm: what runs on the nodes, and what the launcher runs under.

`setup_commands` (pinning this machine's versions on cloud nodes, `runtime_requirements`;
checking Ray's on your hosts), `start_commands` (`ray start` on head and workers),
`head_start_args` (the head's resources as `ray start` arguments; `head_args`: from a cluster
YAML's head node type), `dashboard_port`, `launcher_env` (the environment of `ray up`, or of `ray
start --head` for fake_multinode) and `launch_note` (how to start a dry run's file yourself).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Iterator, Mapping

from omegaconf import DictConfig

from rayflow.backends.vm import internals
from rayflow.backends.vm.defaults import placeholder, with_defaults
from rayflow.backends.vm.rules import CLOUDS
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


def _local_worker_args(b: dict, gpu: bool) -> list[str]:
    t = b["worker"]["gpu" if gpu else "cpu"]
    args = []
    for key, flag in (
        ("num_cpus", "--num-cpus"),
        ("num_gpus", "--num-gpus"),
        ("memory", "--memory"),
        ("object_store_memory", "--object-store-memory"),
    ):
        if t.get(key) is not None:
            args.append(f"{flag}={int(t[key])}")
    return args


def start_commands(b: dict, gpu: bool, auth_mode: str) -> tuple[list[str], list[str]]:
    provider = b["provider"]
    env = _auth_env(auth_mode)
    head = [
        "ray start --head --port=6379 --object-manager-port=8076",
        "--autoscaling-config=~/ray_bootstrap_config.yaml",
        *head_start_args(b),
        f"--dashboard-host={dashboard_host(b, auth_mode)}",
    ]
    worker = ["ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076"]
    if provider == "local":
        # Without --node-ip-address Ray finds no route on such hosts and advertises 127.0.0.1.
        head.append(
            f"--node-ip-address={shlex.quote(str(b.get('head_ip') or placeholder('head_ip')))}"
        )
        worker += ["--node-ip-address=$(hostname -I | cut -d' ' -f1)", *_local_worker_args(b, gpu)]
        prefix = env  # hosts you run: no ulimit raise that may need privileges
    else:  # cloud: resources reach `ray start` from the node type (RAY_OVERRIDE_RESOURCES)
        prefix = f"{env} ulimit -n 65536;"
    return (
        ["ray stop", f"{prefix} {' '.join(head)}"],
        ["ray stop", f"{prefix} {' '.join(worker)}"],
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


def setup_commands(b: Mapping, ray_version: str) -> dict[str, list[str]]:
    provider = b["provider"]
    if provider in CLOUDS:
        # Ray's defaults put the image's conda env on PATH, then install a nightly wheel: keep
        # the first, replace the second with this machine's versions.
        path = {
            "aws": (
                "(stat $HOME/anaconda3/envs/tensorflow2_p310/ &> /dev/null && "
                "echo 'export PATH=\"$HOME/anaconda3/envs/tensorflow2_p310/bin:$PATH\"' "
                ">> ~/.bashrc) || true"
            ),
            "gcp": (
                "(stat /opt/conda/bin/ &> /dev/null && "
                "echo 'export PATH=\"/opt/conda/bin:$PATH\"' >> ~/.bashrc) || true"
            ),
        }[provider]
        sdk = {
            "aws": "pip install 'boto3>=1.4.8'",
            "gcp": "pip install google-api-python-client==1.7.8",
        }[provider]
        return {
            "setup_commands": [path, pin_command(ray_version)],
            "head_setup_commands": [sdk],  # the head's autoscaler talks to the cloud API
            "worker_setup_commands": [],
        }
    if provider == "local":
        # Your hosts, maybe without internet: check the versions instead of installing.
        check = (
            f"test \"$(python -c 'import ray; print(ray.__version__)')\" = {ray_version} || "
            f'{{ echo "rayflow: this host needs ray {ray_version}, as the launcher: '
            f'pip install -U \\"ray[default,tune]=={ray_version}\\"" >&2; exit 1; }}'
        )
        return {"setup_commands": [check], "head_setup_commands": [], "worker_setup_commands": []}
    # this machine's venv
    return {
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
    }


def launcher_env(
    section: DictConfig | Mapping,
    auth_mode: str,
    token_file: str | None = None,
    provider: str | None = None,
) -> dict[str, str]:
    """Environment for the process that starts the cluster (`ray up`, or `ray start --head`
    for fake_multinode), on top of this process's own. provider: the cluster's, where a user's
    cluster YAML (backend.cluster_yaml) names it rather than the section."""
    provider = provider or with_defaults(section)["provider"]
    env = {"RAY_AUTH_MODE": str(auth_mode)}
    if provider == "fake_multinode":
        env["RAY_FAKE_CLUSTER"] = "1"  # the head's monitor builds FakeMultiNodeProvider only then
        # v2 would run prepare_config, which needs Ray's example.yaml (not in the wheel)
        env["RAY_enable_autoscaler_v2"] = "0"
        if auth_mode == "token" and token_file:
            # worker processes start from the head's monitor
            env["RAY_AUTH_TOKEN_PATH"] = str(token_file)
    if provider == "local":
        # Autoscaler v2 loses fresh local-provider hosts (Ray 2.60, ray#59905): `ray up` runs v1.
        env["RAY_UP_enable_autoscaler_v2"] = "0"
    return env


def launch_note(
    provider: str, env: Mapping[str, str], head_args: list[str], token_mounted: bool = False
) -> str:
    """The one line a dry run prints on its provider and how to start the printed cluster YAML
    without rayflow. token_mounted: the file's `file_mounts` names this machine's token file."""
    prefix = " ".join(f"{k}={v}" for k, v in env.items() if k != "RAY_AUTH_TOKEN_PATH")
    # `ray up` would run prepare_config, which needs an example.yaml the wheel lacks
    if provider == "fake_multinode":
        return (
            "rayflow: dry run: provider: fake_multinode (started by rayflow on this machine; "
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
