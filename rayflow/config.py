"""Config checks that run before anything starts, and the redaction of secret values.

Every check raises ConfigError naming the offending key, so the CLI can print one line
and exit non-zero before a cluster, a trial or an MLflow run exists.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator, Mapping

from omegaconf import DictConfig, ListConfig, OmegaConf


class ConfigError(ValueError):
    """Bad user input. `key` is the dotted config key (or override) at fault."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


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


# Words that mark a key or environment variable as secret; matched against the
# words of a name split on '.', '_' and '-' (so "monkey" is not a secret, "api_key" is).
_SECRET_WORDS = {"token", "password", "passwd", "secret", "key", "apikey", "credential", "credentials"}
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    words = re.split(r"[._\-/]+", str(name).lower())
    return any(w in _SECRET_WORDS for w in words)


def redact(value: Any, name: str = "") -> Any:
    """A copy of a (nested) mapping or list with the values of secret-named keys masked."""
    if name and is_secret_name(name) and value is not None and not isinstance(value, (Mapping, list)):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def drop_redacted(value: Any) -> Any:
    """A copy without the leaves redact() masked (for merging a saved config back)."""
    if isinstance(value, Mapping):
        return {k: drop_redacted(v) for k, v in value.items() if v != REDACTED}
    return value


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


def one_of(cfg: DictConfig, key: str, choices: tuple) -> Any:
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
    return value


def check_common(cfg: DictConfig) -> None:
    """Checks on the keys every workload shares (backend- and workload-specific ones live there)."""
    one_of(cfg, "ray_auth_mode", ("token", "disabled"))
    one_of(cfg, "compute.device", ("cpu", "cuda", "auto"))
    if not isinstance(cfg.resume, bool) and not isinstance(cfg.resume, str):
        raise ConfigError("resume", f"must be true, false or an experiment path; got {cfg.resume!r}")
    if cfg.tracking.enabled:
        if not str(cfg.tracking.uri or "").strip():
            raise ConfigError("tracking.uri", "must not be empty (use tracking=none to turn tracking off)")
    data = cfg.data
    if not data.synthetic and not isinstance(data.download, bool):
        raise ConfigError("data.download", f"must be true or false; got {data.download!r}")
    if data.synthetic:
        positive_int(cfg, "data.synthetic_train_size", minimum=10)
        positive_int(cfg, "data.synthetic_test_size", minimum=1)
    fraction = OmegaConf.select(cfg, "data.val_fraction")
    if not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError("data.val_fraction", f"must be between 0 and 1 (exclusive); got {fraction!r}")
