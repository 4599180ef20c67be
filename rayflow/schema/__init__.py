"""Every config key declared once: its kind, range and meaning (pydantic v2 models, one per config
group and option), the rules between keys as validators beside them. `validate(cfg)` is the
first check of the preflight (rayflow.orchestrator.preflight); the config reference in the docs
is generated from the same models (rayflow.reference).

Why pydantic and not OmegaConf structured configs: Hydra already refuses unknown keys while it
composes; what was missing is kinds (a folder name, a creatable directory), ranges and rules
between keys, with messages a user can act on, which pydantic's validators give in one place.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any

from rayflow.errors import ConfigError

if typing.TYPE_CHECKING:
    from rayflow.schema.root import Section

# The models (pydantic) load only when a config is checked: importing this package, as the config
# helpers beside it (rayflow.schema.values) do for `--help`, stays light.

GROUPS = ("backend", "workload", "compute", "tracking")
# The parts whose every key is declared: a key Hydra lets in with `+` (`+workload.num_sample=5`,
# a typo on a preset) is refused as unknown, as Hydra refuses one without `+`. The backend and
# tracking sections stay open: what a user adds there is passed on on purpose (a `spark_conf`
# entry, a tracking credential that must stay masked).
OPEN = ("backend", "tracking")


def root_models(cfg: dict[str, Any]) -> dict[str, type[Section]]:
    """The models of the parts every config has: the root's own keys (""), compute and tracking."""
    from rayflow.schema.root import Compute, Mlflow, NoTracking, Root

    tracking = Mlflow if cfg.get("tracking", {}).get("enabled") else NoTracking
    return {"": Root, "compute": Compute, "tracking": tracking}


def validate(
    cfg: dict[str, Any], models: dict[str, type[Section]], local_paths: bool = True
) -> None:
    """Raise ConfigError (one line naming the key) for the first value of `cfg` (a composed config,
    plain and resolved) that is not of its key's kind or breaks a rule; `models`: each section's
    model ("" for the root's own keys). `local_paths`: paths (storage_path, data.root) are this
    machine's, so they must be creatable and writable here (false where the run goes to other
    machines)."""
    for where, model in models.items():
        section = (
            {k: v for k, v in cfg.items() if k not in (*GROUPS, *models)}
            if where == ""
            else cfg.get(where, {})
        )
        if where not in OPEN and isinstance(section, dict):
            unknown_key(where, model, section)
        validate_section(where, model, section, cfg, local_paths)


def validate_section(
    where: str, model: type[Section], section: Any, cfg: dict[str, Any], local_paths: bool = True
) -> None:
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
    from rayflow.schema.root import Section

    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def unknown_key(where: str, model: type[Section], section: dict[Any, Any]) -> None:
    """Raise ConfigError for the first key of `section` (and of its nested sections) that `model`
    does not declare, with the declared key it is closest to."""
    for key, value in section.items():
        field = model.model_fields.get(str(key))
        name = f"{where}.{key}" if where else str(key)
        if field is None:
            close = difflib.get_close_matches(str(key), list(model.model_fields), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {name.rsplit('.', 1)[0] + '.' if where else ''}{close[0]}?"
                if close
                else ""
            )
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
    relative = getattr(cause, "key", None)
    if relative:
        if relative.startswith("!"):  # a key outside this section (another group's)
            return ConfigError(relative[1:], message)
        key_parts = [*key_parts, relative]
    if first["type"] == "missing":
        message = "is missing"
    return ConfigError(".".join(p for p in key_parts if p) or where, message)


__all__ = ["GROUPS", "root_models", "validate", "validate_section"]
