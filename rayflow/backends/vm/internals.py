"""The one door to Ray's launcher internals (`ray.autoscaler._private`), which only backend=vm
uses: every use of them in rayflow/ goes through a function here (tests/test_layout.py holds it
so), so a Ray upgrade is checked in one place. Each entry says why no public Ray API does the
same: Ray's public launcher (ray.autoscaler.sdk) starts, updates and tears down a cluster from its
YAML, and rayflow also checks a YAML before anything starts, finds a cluster's nodes by its own
owner tag and ends them, and prints what the launcher prints its own way. Nothing is imported
before a function is called, and nothing of rayflow at all.

Not here, as a public call does it: the bootstrapped config (ray.autoscaler.sdk.bootstrap_config,
what Ray's launcher calls _bootstrap_config), the node's IP (ray.util.get_node_ip_address)."""

from __future__ import annotations

from typing import Any

# --- The provider's nodes -------------------------------------------------------------------------


def node_provider(provider_config: dict[str, Any], cluster_name: str) -> Any:
    """The node provider of `provider_config` for `cluster_name`, as Ray's launcher makes it
    (providers._get_node_provider, cached per config as there): listing and terminating the VMs
    of a cluster by their tags (rayflow's owner tag among them). The SDK's get_head_node_ip and
    get_worker_node_ips read a YAML file and Ray's tags only, and terminate nothing."""
    from ray.autoscaler._private.providers import _get_node_provider

    return _get_node_provider(provider_config, cluster_name)


def local_state_path(cluster_name: str) -> str:
    """Where Ray's local (SSH hosts) node provider records the cluster `cluster_name`
    (local.config.get_state_path: /tmp/ray/cluster-NAME.state, a folder anyone may write),
    checked to be this user's before Ray's provider is trusted with it: no public call names it."""
    from ray.autoscaler._private.local.config import get_state_path

    return get_state_path(cluster_name)


# --- A cluster YAML checked as `ray up` checks it, before anything starts -------------------------
# `ray up` (sdk.create_or_update_cluster) prepares and validates the YAML only as it launches;
# rayflow refuses a bad file in the preflight, with Ray's own checks, nothing started.


def provider_defaults(provider_type: str) -> dict[str, Any]:
    """Ray's defaults file of a provider (providers._get_default_config: its defaults.yaml,
    setup_commands included), read where rayflow fills in what a user's file leaves out. The
    SDK's fillout_defaults merges them into a config; none returns them alone."""
    from ray.autoscaler._private.providers import _get_default_config

    return _get_default_config({"type": provider_type})


def prepare_config(config: dict[str, Any]) -> dict[str, Any]:
    """A config as `ray up` prepares it (util.prepare_config: the local provider's hosts as node
    types, its provider's defaults merged in, setup commands merged, the docker section checked,
    each node type's min and max workers filled): the SDK's fillout_defaults does only the
    merging of the defaults."""
    from ray.autoscaler._private.util import prepare_config as prepare

    return prepare(config)


def validate_config(config: dict[str, Any]) -> None:
    """Ray's checks of a config (util.validate_config: ray-schema.json and the node type rules),
    raising as `ray up` raises; no public call validates without launching."""
    from ray.autoscaler._private.util import validate_config as validate

    validate(config)


def check_legacy_fields(config: dict[str, Any]) -> None:
    """Ray's refusal of the fields its node types replaced (util.check_legacy_fields: head_node,
    worker_nodes without available_node_types), as `ray up` checks them; no public call."""
    from ray.autoscaler._private.util import check_legacy_fields as check

    check(config)


# --- What the launcher does and prints while it runs ----------------------------------------------


def create_cluster_events() -> list[Any]:
    """Every event of `ray up` (event_system.CreateClusterEvent: acquiring_new_head_node,
    head_node_acquired, ...), each registered with the public sdk.register_callback_handler,
    which takes the members of this private enum: no public name lists them."""
    from ray.autoscaler._private.event_system import CreateClusterEvent

    return list(CreateClusterEvent)


def launcher_logger() -> Any:
    """The launcher's printer, one object for the whole process (cli_logger.cli_logger): rayflow
    configures it for a run and puts all its settings back after. The public
    sdk.configure_logging sets three of them and cannot put anything back."""
    from ray.autoscaler._private.cli_logger import cli_logger

    return cli_logger


def fill_aws_node_resources(config: dict[str, Any]) -> dict[str, Any]:
    """The AWS node types with the resources `ray up` fills in from the EC2 instance types
    (aws.node_provider.AWSNodeProvider.fillout_available_node_types_resources: CPU, GPU,
    memory), for a dry run and the capacity check; Ray's launcher does it only as it launches."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    return AWSNodeProvider.fillout_available_node_types_resources(config)


__all__ = [
    "check_legacy_fields",
    "create_cluster_events",
    "fill_aws_node_resources",
    "launcher_logger",
    "local_state_path",
    "node_provider",
    "prepare_config",
    "provider_defaults",
    "validate_config",
]
