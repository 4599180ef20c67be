"""An override of a key the composed config does not have, said in rayflow's words: the nearest
key of the same section (did you mean), or the options of its group that do have it (a key of
backend=spark given with backend=local), in place of OmegaConf's "Key ... is not in struct"."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from importlib import resources
from typing import Any

from rayflow.errors import ConfigError

GROUPS = ("backend", "workload", "compute", "tracking")
SHOWN = 12  # keys listed when no close one is found


def unknown_key_error(key: str, overrides: list[str], compose: Callable[..., Any]) -> ConfigError:
    """The ConfigError for `key`, which the config composed from `overrides` does not have;
    `compose(*overrides)` composes the others (to list the keys the section has)."""
    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") != key]
    cfg = _plain(compose(*rest))
    parent, _, leaf = key.rpartition(".")
    section = _select(cfg, parent) if parent else cfg
    siblings = sorted(section) if isinstance(section, dict) else []
    close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
    if close:
        return ConfigError(key, f"unknown key; did you mean {_join(parent, close[0])}?")
    group = key.split(".", 1)[0]
    if group in GROUPS and parent:
        chosen = str(cfg.get(group, {}).get("name", "")) or "the chosen one"
        others = [o for o in _options(group) if o != chosen and _has(group, o, key)]
        if others:
            where = ", ".join(f"{group}={o}" for o in others)
            return ConfigError(key, f"not a key of {group}={chosen}; it is a key of {where}")
    elsewhere = [
        g for g in GROUPS if not parent and isinstance(cfg.get(g), dict) and leaf in cfg[g]
    ]
    if elsewhere:
        return ConfigError(key, f"unknown key; did you mean {elsewhere[0]}.{leaf}?")
    listed = ", ".join(siblings[:SHOWN]) + (", ..." if len(siblings) > SHOWN else "")
    where = f"{parent} has" if parent else "the top level has"
    return ConfigError(key, f"unknown key ({where}: {listed}; docs/reference/config.md)")


def _plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=False)
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def _select(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _join(parent: str, leaf: str) -> str:
    return f"{parent}.{leaf}" if parent else leaf


def _options(group: str) -> list[str]:
    # rayflow's own options (conf/GROUP/*.yaml): a backend plugin's keys (its model's, not a YAML)
    # are not searched for the backend a key given beside another belongs to
    folder = resources.files("rayflow.conf").joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _has(group: str, option: str, key: str) -> bool:
    """Whether the option's own YAML (conf/GROUP/OPTION.yaml) has `key` (group.a.b), null or not."""
    import yaml

    text = resources.files("rayflow.conf").joinpath(group).joinpath(f"{option}.yaml").read_text()
    doc = yaml.safe_load(text) or {}
    parent, _, leaf = key.split(".", 1)[1].rpartition(".")
    node = _select(doc, parent) if parent else doc
    return isinstance(node, dict) and leaf in node
