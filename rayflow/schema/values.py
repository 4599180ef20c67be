"""Helpers on composed configs: flattening, plain containers, safe YAML for logs, the overrides
merge of a rendered spec, and the keys Ray removed (named with their replacements). The keys'
kinds and rules are rayflow.schema's."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rayflow.errors import ConfigError
from rayflow.security.redaction import redact

# Keys that older posts and versions use, and what replaced them: the CLI names the
# replacement instead of calling the key unknown.
RENAMED = {
    "backend.num_worker_nodes": "backend.max_worker_nodes and backend.min_worker_nodes",
    "backend.autoscale": (
        "backend.min_worker_nodes < backend.max_worker_nodes (autoscaling is on when min < max)"
    ),
    "backend.num_cpus_per_node": "backend.num_cpus_worker_node",
    "backend.num_gpus_per_node": "backend.num_gpus_worker_node",
    "backend.object_store_memory_per_node": "backend.object_store_memory_worker_node",
}


def renamed_key_error(key: str) -> ConfigError | None:
    if key in RENAMED:
        return ConfigError(key, f"was removed from setup_ray_cluster; use {RENAMED[key]}")
    return None


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted (key, leaf) pairs of a nested mapping; lists stay leaves."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, value


def to_container(node: Any) -> Any:
    """A config node as plain Python, resolved; a value that is no DictConfig or ListConfig as it
    is."""
    return (
        OmegaConf.to_container(node, resolve=True)
        if isinstance(node, (DictConfig, ListConfig))
        else node
    )


def safe_yaml(cfg: DictConfig | Mapping[str, Any]) -> str:
    """The resolved config as YAML with secrets masked: what reaches logs and MLflow."""
    data = to_container(cfg) if isinstance(cfg, (DictConfig, ListConfig)) else dict(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(redact(data)))


def merge_overrides(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` deep-merged over `base`; a null in `top` deletes the key: how a backend's
    `overrides` section changes the spec it renders (vm's cluster YAML, kuberay's manifest)."""
    out = copy.deepcopy(dict(base))
    for key, value in top.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
