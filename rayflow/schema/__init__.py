"""Every config key declared once: its kind, range and meaning (pydantic v2 models, one per config
group and option), the rules between keys as validators beside them. `validate(cfg)` is the
first check of the preflight (rayflow.composition.check_config); the config reference in the docs
is generated from the same models (rayflow.schema.reference).

Why pydantic and not OmegaConf structured configs: Hydra already refuses unknown keys while it
composes; what was missing is kinds (a folder name, a creatable directory), ranges and rules
between keys, with messages a user can act on, which pydantic's validators give in one place.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rayflow.errors import ConfigError
from rayflow.schema.backends import BACKENDS
from rayflow.schema.root import Compute, Data, Mlflow, NoTracking, Root, Section
from rayflow.schema.workloads import WORKLOADS

GROUPS = ("backend", "workload", "compute", "tracking")
# The parts whose every key is declared: a key Hydra lets in with `+` (`+workload.num_sample=5`,
# a typo on a preset) is refused as unknown, as Hydra refuses one without `+`. The backend and
# tracking sections stay open: what a user adds there is passed on on purpose (a `spark_conf`
# entry, a tracking credential that must stay masked).
CLOSED = ("", "data", "compute", "workload")


def section_models(cfg: dict) -> dict[str, type[Section]]:
    """The model of each part of a composed config: the root's own keys, data, and the option
    chosen in each group."""
    models: dict[str, type[Section]] = {"": Root, "data": Data, "compute": Compute,
                                        "tracking": Mlflow if cfg.get("tracking", {}).get("enabled") else NoTracking}
    workload = cfg.get("workload", {})
    model = WORKLOADS.get(workload.get("name")) or WORKLOADS.get(workload.get("kind"))
    if model is not None:  # a preset, or a kind under the user's own name
        models["workload"] = model
    if cfg.get("backend", {}).get("name") in BACKENDS:
        models["backend"] = BACKENDS[cfg["backend"]["name"]]
    return models


def validate(cfg: DictConfig, local_paths: bool = True) -> None:
    """Raise ConfigError (one line naming the key) for the first value that is not of its key's
    kind or breaks a rule. `local_paths`: paths (storage_path, data.root) are this machine's,
    so they must be creatable and writable here (false where the run goes to other machines)."""
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    for where, model in section_models(data).items():
        section = {k: v for k, v in data.items() if k not in (*GROUPS, "data")} if where == "" else data.get(where, {})
        if where in CLOSED and isinstance(section, dict):
            unknown_key(where, model, section)
        validate_section(where, model, section, data, local_paths)


def validate_section(where: str, model: type[Section], section: Any, cfg: dict, local_paths: bool = True) -> None:
    """One section (`where`: "backend", "workload", ...; "" for the root's own keys) against its
    model; `cfg`: the whole config as far as its rules read it (another group's keys). A backend's
    own check() calls it with its section, so that the backend checked alone is checked whole."""
    from pydantic import ValidationError

    try:
        model.model_validate(section, context={"cfg": cfg, "local_paths": local_paths})
    except ValidationError as err:
        raise _one_line(where, err) from None


def _section_model(annotation: Any) -> Any:
    """The model of a nested section key (`Model`, or `Model | None`), or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def unknown_key(where: str, model: type[Section], section: dict) -> None:
    """Raise ConfigError for the first key of `section` (and of its nested sections) that `model`
    does not declare, with the declared key it is closest to."""
    for key, value in section.items():
        field = model.model_fields.get(str(key))
        name = f"{where}.{key}" if where else str(key)
        if field is None:
            close = difflib.get_close_matches(str(key), list(model.model_fields), n=1, cutoff=0.6)
            hint = f"; did you mean {name.rsplit('.', 1)[0] + '.' if where else ''}{close[0]}?" if close else ""
            raise ConfigError(name, f"unknown config key{hint}")
        nested = _section_model(field.annotation)
        if nested is not None and isinstance(value, dict):
            unknown_key(name, nested, value)


def _one_line(where: str, err: Any) -> ConfigError:
    first = err.errors(include_url=False)[0]
    path = [str(p) for p in first["loc"]]
    cause = (first.get("ctx") or {}).get("error")
    message = str(cause) if cause is not None else first["msg"]
    key_parts = [where, *path] if where else path
    if getattr(cause, "key", None):
        relative = cause.key
        if relative.startswith("!"):  # a key outside this section (another group's)
            return ConfigError(relative[1:], message)
        key_parts = [*key_parts, relative]
    if first["type"] == "missing":
        message = "is missing"
    return ConfigError(".".join(p for p in key_parts if p) or where, message)


__all__ = ["ConfigError", "GROUPS", "section_models", "validate", "validate_section"]
