"""Config checks that run before anything starts, and the redaction of secret values.

Every check raises ConfigError naming the offending key, so the CLI can print one line
and exit non-zero before a cluster, a trial or an MLflow run exists.
"""

from __future__ import annotations

import copy
import functools
import math
from importlib import resources
from typing import Any, Iterator, Mapping

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from rayflow.errors import ConfigError
from rayflow.redaction import REDACTED, drop_redacted, is_secret_name, mask_text, redact

__all__ = ["REDACTED", "drop_redacted", "is_secret_name", "mask_text", "redact"]  # re-exported


# Keys that older posts and versions use, and what replaced them: the CLI names the
# replacement instead of calling the key unknown.
RENAMED = {
    "backend.num_worker_nodes": "backend.max_worker_nodes and backend.min_worker_nodes",
    "backend.autoscale": "backend.min_worker_nodes < backend.max_worker_nodes (autoscaling is on when min < max)",
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


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def safe_yaml(cfg: DictConfig | Mapping) -> str:
    """The resolved config as YAML with secrets masked: what reaches logs and MLflow."""
    data = to_container(cfg) if isinstance(cfg, (DictConfig, ListConfig)) else dict(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(redact(data)))


# --- checks ---------------------------------------------------------------------------


def positive_int(cfg: DictConfig, key: str, minimum: int = 1) -> int:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def positive_number(cfg: DictConfig, key: str, allow_zero: bool = False) -> float:
    value = OmegaConf.select(cfg, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(key, f"must be a number {bound}, got {value!r}")
    return float(value)


def bounds(cfg: DictConfig, key: str, log: bool = False) -> tuple[float, float]:
    low = positive_number(cfg, f"{key}.min") if log else OmegaConf.select(cfg, f"{key}.min")
    high = positive_number(cfg, f"{key}.max") if log else OmegaConf.select(cfg, f"{key}.max")
    if low > high:
        raise ConfigError(key, f"min ({low}) is greater than max ({high})")
    return low, high


def boolean(cfg: DictConfig, key: str) -> bool:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def gpu_request(cfg: DictConfig, key: str) -> float:
    """GPUs per trial or worker: null means none; more than 0 needs compute=gpu (or auto)."""
    gpu = OmegaConf.select(cfg, key)
    if gpu is None:
        return 0.0
    gpu = positive_number(cfg, key, allow_zero=True)
    if gpu > 0 and cfg.compute.device == "cpu":
        raise ConfigError(key, f"is {gpu:g} but compute=cpu; use compute=gpu")
    return gpu


BOOLEAN_OR_PATH = {"resume"}  # false, true, or an experiment folder (checked by tuning.experiment_dir)


@functools.lru_cache(maxsize=1)
def boolean_keys() -> frozenset[str]:
    """Every key whose shipped default is true or false (root config and every group option).
    A value given for one of them must be a boolean too: Hydra reads `maybe` as a string,
    and a non-empty string is truthy."""
    keys: set[str] = set()

    def walk(node: Any, prefix: str) -> None:
        for key, value in (node or {}).items():
            if key in ("defaults", "hydra"):
                continue
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, bool) and path not in BOOLEAN_OR_PATH:
                keys.add(path)
            elif isinstance(value, dict):
                walk(value, path)

    root = resources.files("rayflow.conf")
    walk(yaml.safe_load(root.joinpath("config.yaml").read_text()), "")
    for group in root.iterdir():
        if group.is_dir() and not group.name.startswith("_"):
            for option in group.iterdir():
                if option.name.endswith(".yaml"):
                    walk(yaml.safe_load(option.read_text()), group.name)
    return frozenset(keys)


def check_booleans(cfg: DictConfig) -> None:
    for key in sorted(boolean_keys()):
        if OmegaConf.select(cfg, key, default=None) is not None or _has(cfg, key):
            boolean(cfg, key)


def _has(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


def one_of(cfg: DictConfig, key: str, choices: tuple) -> Any:
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


def check_common(cfg: DictConfig) -> None:
    """Checks on the keys every workload shares (backend- and workload-specific ones live there)."""
    check_booleans(cfg)
    one_of(cfg, "ray_auth_mode", ("token", "disabled"))
    one_of(cfg, "compute.device", ("cpu", "cuda", "auto"))
    if not isinstance(cfg.resume, bool) and not isinstance(cfg.resume, str):
        raise ConfigError("resume", f"must be true, false or an experiment path; got {cfg.resume!r}")
    if cfg.tracking.enabled:
        if not str(cfg.tracking.uri or "").strip():
            raise ConfigError("tracking.uri", "must not be empty (use tracking=none to turn tracking off)")
    data = cfg.data
    positive_number(cfg, "data.timeout_s")
    if data.synthetic:
        positive_int(cfg, "data.synthetic_train_size", minimum=10)
        positive_int(cfg, "data.synthetic_test_size", minimum=1)
    fraction = OmegaConf.select(cfg, "data.val_fraction")
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError("data.val_fraction", f"must be between 0 and 1 (exclusive); got {fraction!r}")


def merge_overrides(base: Mapping, top: Mapping) -> dict:
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


def checked_number(value: Any, key: str, positive: bool) -> float:
    """A finite number >= 0 (> 0 when `positive`) from a plain section, else ConfigError naming `key`."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise ConfigError(key, f"must be a number {'> 0' if positive else '>= 0'}; got {value!r}")
    return float(value)
