"""resume=PATH (or true): the experiment's own config again, with the command line's keys on top.

An experiment's state (rayflow.results.experiment) records the group choices of its command line and
the sections of its config that a resume restores: those of the trials (the workload, the sections
it brings such as `data`, seed, compute) and of where they ran (backend, tracking); the root's other
keys (storage_path, schedule_timeout_s, ...) are the resume command's own. Keys that shape what the
trials run are kept as the experiment ran them (Tuner.restore and Ray Train keep their own): a
different value on the resume command line is refused, naming it, rather than silently ignored; a
section's model names the keys a resume may change (`resume_may_change`: where the job's files or
the data come from).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from rayflow.results.experiment import Experiment, read_state, resumed_folder
from rayflow.workloads import workload_keys

GROUPS = ("backend", "workload", "compute", "tracking")  # the defaults list's choices
# Always restored: the trials' sections and where they ran; the workload's own sections come on top.
RESUMED_KEYS = ("workload", "seed", "compute", "backend", "tracking")
TRIAL_KEYS = ("workload", "seed", "compute")  # the trials' own, fixed on resume


def _sections(cfg: DictConfig) -> dict[str, Any]:
    """The root sections the config's workload brings (cifar and ddp: `data`), with their models."""
    return dict(getattr(workload_keys(cfg.workload), "sections", {}))


def resumed_keys(cfg: DictConfig) -> tuple[str, ...]:
    """The sections of `cfg` that an experiment's state records and a resume restores."""
    return (*RESUMED_KEYS, *_sections(cfg))


def trial_keys(cfg: DictConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the keys that shape the trials, those of them a resume may change anyway)."""
    sections = _sections(cfg)
    model = workload_keys(cfg.workload)
    changeable = [f"workload.{k}" for k in getattr(model, "resume_may_change", ())]
    changeable += [
        f"{s}.{k}" for s, m in sections.items() for k in getattr(m, "resume_may_change", ())
    ]
    return (*TRIAL_KEYS, *sections), tuple(changeable)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def group_choices(overrides: list[str]) -> dict[str, str]:
    """The defaults-list choices a command line makes (`workload=tune`), and its
    hydra.searchpath (the user's own options): what an experiment's state records to compose
    its config again on resume."""
    return {
        _key(o): o.split("=", 1)[1]
        for o in overrides
        if "=" in o and (_key(o) in GROUPS or _key(o) == "hydra.searchpath")
    }


def _within(key: str, keys: tuple[str, ...] | set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in keys)


def resumed(point: list[str], cfg: DictConfig) -> tuple[list[str], DictConfig]:
    """A resume's overrides and config: the experiment's group choices and every key its state
    recorded, with the keys the command line gives on top. A key that shapes the trials and
    differs from the experiment's is refused, naming it; a secret the state holds masked comes
    from the command line or the environment (its interpolation), or is refused. `resume` becomes
    the folder, so every later look-up finds this same experiment."""
    path = resumed_folder(cfg)
    state = read_state(path)
    saved = state.get("config", {})
    choices = _saved_choices(state, saved, group_choices(point), path)
    point = [f"{g}={c}" for g, c in choices.items() if g not in group_choices(point)] + [
        o for o in point if _key(o) != "resume"
    ]
    point.append(f"resume={path}")
    cfg = compose_config(*point)
    given = {_key(o) for o in point if "=" in o or o.startswith("~")} - set(GROUPS)
    fixed, changeable = trial_keys(cfg)
    # first: a resume that changes the trials is refused, whatever else it lacks
    for key in sorted(given):
        if _within(key, fixed) and not _within(key, changeable):
            _check_unchanged(cfg, key, saved, path)
    same_groups = {g for g in GROUPS if group_choices(point).get(g) == choices.get(g)}
    _restore_sections(cfg, saved, given, same_groups)
    return point, cfg


def _saved_choices(
    state: dict[str, Any], saved: dict[str, Any], given: dict[str, str], path: Experiment
) -> dict[str, str]:
    """The experiment's group choices; the command line may not choose another workload or
    compute."""
    choices: dict[str, str] = state.get("choices") or {}
    if not choices and isinstance(saved.get("workload"), dict) and saved["workload"].get("name"):
        choices = {"workload": str(saved["workload"]["name"])}  # an experiment of an older rayflow
    for group, choice in choices.items():
        if group in ("workload", "compute") and given.get(group, choice) != choice:
            raise ConfigError(
                group,
                f"cannot change on resume: {path} ran {group}={choice} (leave it out, "
                "or leave out resume= to start a new experiment)",
            )
    return choices


def _restore_sections(
    cfg: DictConfig, saved: dict[str, Any], given: set[str], same_groups: set[str]
) -> None:
    """The saved sections into cfg, but for what the command line gives; a group's section only
    where the command line chose the same option as the experiment."""
    from omegaconf import open_dict

    with open_dict(cfg):
        for section in resumed_keys(cfg):
            if section not in saved or (section in GROUPS and section not in same_groups):
                continue
            # key by key: a mapping in it is the experiment's whole
            if isinstance(saved[section], dict):
                for key, value in saved[section].items():
                    _restore(cfg, f"{section}.{key}", value, given)
            else:
                _restore(cfg, section, saved[section], given)


def _restore(cfg: DictConfig, key: str, value: Any, given: set[str]) -> None:
    """The saved `value` of `key` into cfg, but for the keys the command line gives."""
    from omegaconf import OmegaConf

    from rayflow.security.redaction import REDACTED

    if key in given:
        return
    if isinstance(value, dict) and any(g.startswith(key + ".") for g in given):
        for k, v in value.items():
            _restore(cfg, f"{key}.{k}", v, given)
        return
    if isinstance(value, dict) and _holds(value, REDACTED):
        for k, v in value.items():  # down to the masked leaves, which keep the value given now
            _restore(cfg, f"{key}.{k}", v, given)
        return
    if value == REDACTED or (isinstance(value, str) and REDACTED in value):
        absent = object()
        now = OmegaConf.select(cfg, key, default=absent, throw_on_missing=False)
        if now in (None, "", absent) or (isinstance(now, str) and REDACTED in now):
            # a key the run added (`+key`), or one of rayflow's
            how = f"+{key}=..." if now is absent else f"{key}=..."
            raise ConfigError(
                key,
                "its value was masked in the experiment's saved state: give it again on the "
                f"command line ({how}) or in the environment it reads",
            )
        return
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _holds(value: Any, marker: str) -> bool:
    if isinstance(value, dict):
        return any(_holds(v, marker) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, marker) for v in value)
    return isinstance(value, str) and marker in value


def _check_unchanged(cfg: DictConfig, key: str, saved: dict[str, Any], path: Experiment) -> None:
    """A key of the resume command line that shapes the trials must keep the experiment's value."""
    from omegaconf import OmegaConf

    from rayflow.schema.values import to_container

    node: object = saved
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return  # the experiment did not record it: nothing to compare with
        node = node[part]
    now = to_container(OmegaConf.select(cfg, key, default=None))
    if now != node:
        raise ConfigError(
            key,
            f"cannot change on resume: {path} ran with {node!r} (leave it out, "
            "or leave out resume= to start a new experiment)",
        )
