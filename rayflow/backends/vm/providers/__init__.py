"""backend=vm's providers, by the `provider.type` of a cluster YAML: one module each, routed to as
SkyPilot routes by cloud, behind one `Provider` (providers.base: what each says and does, and what
they share). `fake_multinode` (Ray's fake provider: nodes as processes here), `local` (your
hosts over SSH), and the clouds, `aws` and `gcp`, on what they share (providers.cloud); `ec2` is
the EC2 API asked before `ray up` asks it. Any other type Ray launches (azure, from a user's file
only) is `Provider` itself: Ray's launcher as it is.

The registry names each provider's module, imported on its first lookup (as rayflow.backends
imports a backend): looking up a provider never loads the others, and a provider's module may use
the vm modules that look providers up. Here too: which keys of the `backend:` section apply to
which providers, and the rules that say so (`section_rules`, `node_type_rules`).
"""

from __future__ import annotations

import importlib

from rayflow.backends.vm.providers.base import Provider
from rayflow.backends.vm.rules import PROVIDER_KEYS, shipped_defaults, worker_bounds_rule
from rayflow.schema.kinds import KeyedError

PACKAGE = "rayflow.backends.vm.providers"
# the providers rayflow renders a cluster YAML for (`backend.provider`): each a module of that name
TYPES = ("fake_multinode", "local", "aws", "gcp")
# what rayflow starts from a user's file (backend.cluster_yaml): those, and Ray's other clouds
LAUNCHED = (*TYPES, "azure")

NODE_TYPE_KEYS = ("instance_type", "accelerator_type", "spot", "min_workers", "max_workers")


def get(kind: object) -> Provider:
    """The provider of a cluster YAML's `provider.type`: its module's, or, for any other type,
    Ray's launcher as it is (`Provider`)."""
    if kind not in TYPES:
        return Provider(str(kind))
    # imported once (Python's module cache), its one PROVIDER with it
    found = importlib.import_module(f"{PACKAGE}.{kind}").PROVIDER
    assert isinstance(found, Provider), kind  # each module's PROVIDER
    return found


def each() -> list[Provider]:
    """Every provider rayflow renders for, in TYPES order."""
    return [get(kind) for kind in TYPES]


def in_place() -> Provider:
    """The provider whose nodes are processes of this machine, stopped by their temp dir."""
    [found] = [provider for provider in each() if provider.in_place]
    return found


def applies_to(key: str, node_type: bool = False) -> tuple[str, ...]:
    """The providers a key that only some take applies to (a node type's, with node_type)."""
    return tuple(p.name for p in each() if key in (p.node_type_keys if node_type else p.keys))


def section_rules(b: dict) -> None:
    """Keys of other providers left at their default, then the provider's own rules (b: the
    validated section)."""
    provider = get(b["provider"])
    for key in PROVIDER_KEYS:
        if b[key] not in (None, shipped_defaults().get(key)) and key not in provider.keys:
            raise KeyedError(
                key,
                f"has no effect with provider={provider.name} (it applies to "
                f"{', '.join(applies_to(key))})",
            )
    provider.check(b)


def node_type_rules(b: dict, kind: str, gpu: bool) -> None:
    """A node type against the provider (its own rules, then the keys it takes) and the overall
    bounds."""
    provider, t, prefix = get(b["provider"]), b["worker"][kind], f"worker.{kind}"
    provider.check_node_type(b, kind)
    for key in NODE_TYPE_KEYS:
        if t.get(key) not in (None, False) and key not in provider.node_type_keys:
            hint = (
                "; the hosts are the node type: use backend.min_worker_nodes / max_worker_nodes"
                if provider.hosts and "workers" in key
                else ""
            )
            raise KeyedError(
                f"{prefix}.{key}",
                f"has no effect with provider={provider.name} (it applies to "
                f"{', '.join(applies_to(key, node_type=True))}){hint}",
            )
    worker_bounds_rule(b, kind, gpu)


__all__ = [
    "LAUNCHED",
    "TYPES",
    "Provider",
    "applies_to",
    "each",
    "get",
    "in_place",
    "node_type_rules",
    "section_rules",
]
