"""backend=vm on aws and gcp: every VM carries the owner tag of the run that started its cluster,
and rayflow selects only VMs that carry it.

Ray's node providers find a cluster's VMs by one tag, its name (`ray-cluster-name`, an EC2 tag or
a GCE label), which anyone with the account can set: with the default name `rayflow`, another
user's cluster of that name is "the cluster" to Ray. So at start every node type's node_config
gets `rayflow-owner: OWNER` (OWNER: the `owner_run` of the run that started the cluster, 128
random bits; a run that joins a kept cluster renders the kept one's, so Ray's launch-config hash
is unchanged and the head is never replaced), where Ray passes it on at create time, for the
head that `ray up` creates and the workers the head's autoscaler creates; where a node's config
carries it is its provider's (rayflow.backends.vm.providers: `tag_node`, `node_owner`). The tag
travels inside the cluster YAML, so whatever tears the cluster down reads its owner from the file
it is given.

Every selection rayflow makes filters on both the name and the owner: the start's teardown
(start timeout, Ctrl-C, a failed start, the end of a run), `rayflow down` and
`python -m rayflow.backends.vm.teardown`, the head's autostop, and the head a tunnel is opened to.
A start is refused (`check_name_free`) while any VM of its name exists in the account that is not
the kept cluster of this user's it joins: Ray's launcher and the head's autoscaler act on every
VM of the name, so two clusters of one name must never run at once.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from rayflow.backends.vm import internals, providers
from rayflow.errors import ClusterError, ConfigError

OWNER_TAG = "rayflow-owner"
SETTLE_TIMEOUT_S = 120.0  # terminate calls until the API lists none of the cluster's VMs
POLL_S = 1.0


def tag(config: dict[str, Any], owner: str) -> dict[str, Any]:
    """The cluster config with every node type's VMs tagged `rayflow-owner: owner` (a copy)."""
    tagged = copy.deepcopy(config)
    provider = providers.get(tagged["provider"]["type"])
    for node_type in (tagged.get("available_node_types") or {}).values():
        provider.tag_node(node_type.setdefault("node_config", {}), owner)
    return tagged


def owner_of(config: dict[str, Any]) -> str | None:
    """The owner tag the head's node type carries in this cluster config, or None."""
    types = config.get("available_node_types") or {}
    node = (types.get(config.get("head_node_type")) or {}).get("node_config") or {}
    return providers.get(config["provider"]["type"]).node_owner(node)


def provider_of(config: dict[str, Any], **overrides: Any) -> Any:
    return internals.node_provider({**config["provider"], **overrides}, config["cluster_name"])


def nodes(provider: Any, owner: str, kind: str | None = None) -> list[str]:
    """The live VMs of the provider's cluster name that carry `owner` (of one kind: head,
    worker)."""
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND

    wanted = {OWNER_TAG: owner, **({TAG_RAY_NODE_KIND: kind} if kind else {})}
    return list(provider.non_terminated_nodes(wanted))


def check_name_free(config: dict[str, Any], state: dict | None, stop_hint: str = "") -> bool:
    """Whether a head of the kept cluster `state` records runs (to be joined). Refused in one
    line naming backend.cluster_name while any VM of the name runs that is not that cluster's:
    another run's, another user's, a cluster this user did not keep."""
    from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND

    provider = provider_of(config)
    found = provider.non_terminated_nodes({})
    kept = state.get("owner_run") if state and state.get("kept") else None
    tags = {node: provider.node_tags(node) for node in found}
    foreign = [node for node in found if not kept or tags[node].get(OWNER_TAG) != kept]
    if foreign:
        name = config["cluster_name"]
        raise ConfigError(
            "backend.cluster_name",
            f"{len(foreign)} VM(s) tagged ray-cluster-name={name} already run in the account "
            "that no cluster you kept started (another run's or another user's); Ray acts on "
            "every VM of a name, so rayflow starts no second cluster of it: give this run a "
            f"name of its own (backend.cluster_name=...){stop_hint}",
        )
    return any(tags[node].get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD for node in found)


def head_ip(config: dict[str, Any], owner: str) -> str | None:
    """The address of the cluster's head that carries `owner` (as Ray's `get_head_node_ip`
    chooses it), or None when there is none."""
    from ray.autoscaler.tags import NODE_KIND_HEAD

    provider = provider_of(config)
    heads = nodes(provider, owner, NODE_KIND_HEAD)
    if not heads:
        return None
    settings = config["provider"]
    if settings.get("use_internal_ips") and not settings.get("use_external_head_ip"):
        return str(provider.internal_ip(heads[0]))
    return str(provider.external_ip(heads[0]))


def terminate(
    config: dict[str, Any],
    owner: str,
    stop_cached: bool,
    busy: Any = lambda: False,
    settle_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Terminate the VMs of the cluster that carry `owner`, the head last, until the API lists
    none and `busy()` (a create call in flight) is false, at most settle_s (ClusterError past it).
    Stopped instead of terminated only where `stop_cached` (the file's `cache_stopped_nodes:
    true`)."""
    provider = provider_of(config, cache_stopped_nodes=stop_cached)
    deadline = time.monotonic() + settle_s
    while True:
        # asked before the listing: a create call that ends between the two leaves its VM in
        # the next listing, not behind (the caller has forbidden new ones: only one in flight)
        creating = busy()
        found = nodes(provider, owner)
        if found:
            _terminate(provider, owner, found)
        elif not creating:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"cluster {config['cluster_name']}: VMs {', '.join(found) or 'being created'} "
                f"still not terminated after {settle_s:g} s: terminate them by hand in the cloud "
                f"console (tags ray-cluster-name={config['cluster_name']} and "
                f"{OWNER_TAG}={owner})"
            )
        time.sleep(POLL_S)


def _terminate(provider: Any, owner: str, found: list[str]) -> None:
    """The workers, then the head: on the head, the autostop watcher is what terminates them."""
    from ray.autoscaler.tags import NODE_KIND_HEAD

    heads = set(nodes(provider, owner, NODE_KIND_HEAD))
    workers = [node for node in found if node not in heads]
    if workers:
        provider.terminate_nodes(workers)
    if heads:
        provider.terminate_nodes(sorted(heads))
