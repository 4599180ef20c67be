"""resume=PATH (or true): the experiment's own config again, with the command line's keys on top.

An experiment's state (rayflow.results.experiment) records the group choices of its command line and
the sections of its config that a resume restores. What it may restore is an allow-list: the
trials' own (the workload and its choice, the sections it brings such as `data`, seed, compute).
Nothing that says where the run goes or with which credentials comes from it, even from a signed
experiment (it was read back from a store): the backend (its choice and keys: credentials, a
kubeconfig, a cluster file), the tracking section and its address, ray_auth_mode and
hydra.searchpath are this invocation's own, like the root's other keys (storage_path,
schedule_timeout_s, ...). So the resume command rayflow prints (`resume_command`) carries them, as
this invocation gave them, but for secrets (a resume asks for those by name).

Keys that shape what the trials run are kept as the experiment ran them (Tuner.restore and Ray
Train keep their own): a different value on the resume command line is refused, naming it, rather
than silently ignored; a section's model names the keys a resume may change (`resume_may_change`:
where the job's files or the data come from). The experiment is verified (rayflow.results
.verification) before its state is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig

from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config
from rayflow.results.experiment import Experiment, Resumed, resumed_folder
from rayflow.workloads import workload_keys

GROUPS = ("backend", "workload", "compute", "tracking")  # the defaults list's choices
RESUMED_GROUPS = ("workload", "compute")  # the choices an experiment's state may set again
# The sections it may set again (the workload's own sections come on top): the trials' own.
RESUMED_KEYS = ("workload", "seed", "compute")
TRIAL_KEYS = ("workload", "seed", "compute")  # the trials' own, fixed on resume
# What a resume takes from its command line only, and the resume command carries from this one.
CARRIED_KEYS = ("backend", "tracking", "ray_auth_mode", "hydra.searchpath", "storage_shared")
CHOICE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]{0,99}")  # an option's name in a group


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
    """The defaults-list choices a command line makes (`workload=tune`, `backend=vm`)."""
    return {_key(o): o.split("=", 1)[1] for o in overrides if "=" in o and _key(o) in GROUPS}


def carried(overrides: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(the overrides of a command line that a resume of its experiment needs again: CARRIED_KEYS,
    the backend's choice and keys, tracking, ray_auth_mode, hydra.searchpath, storage_shared;
    the keys of those among them that hold a secret, left out: a resume asks for them by name)."""
    shown: list[str] = []
    withheld: list[str] = []
    for override in overrides:
        key = _key(override)
        if _within(key, CARRIED_KEYS):
            (withheld if _secret(override) else shown).append(override)
    return shown, sorted({_key(o) for o in withheld})


def _secret(override: str) -> bool:
    """Whether an override holds a secret: its text masked when printed, or its value masked in a
    config (rayflow.security.redaction)."""
    from rayflow.security.redaction import mask_text, redact

    if mask_text(override) != override:
        return True
    nested: Any = override.split("=", 1)[1] if "=" in override else ""
    for part in reversed(_key(override).split(".")):
        nested = {part: nested}
    return bool(redact(nested) != nested)


def resume_command(where: str, overrides: list[str] | tuple[str, ...]) -> str:
    """The command that continues the experiment at `where`, for a user to paste: `resume=` and
    what it does not restore from the experiment (`carried`), each quoted for a shell."""
    import shlex

    return shlex.join(["python", "-m", "rayflow", f"resume={where}", *overrides])


def _within(key: str, keys: tuple[str, ...] | set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in keys)


def resumed(
    point: list[str], cfg: DictConfig, asks: bool = True, found: Resumed | None = None
) -> tuple[list[str], DictConfig]:
    """A resume's overrides and config: the experiment's group choices and every key its state
    recorded, with the keys the command line gives on top. A key that shapes the trials and
    differs from the experiment's is refused, naming it; a secret the state holds masked comes
    from the command line or the environment (its interpolation), or is refused. `resume` becomes
    the folder, so every later look-up finds this same experiment. `found`: the experiment as
    the preflight located it, its state read (resumed_folder), else located now."""
    found = found or resumed_folder(cfg)  # verified before anything of it is read
    path, state = found.experiment, found.state
    saved = state.get("config", {})
    saved = saved if isinstance(saved, dict) else {}
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
    if asks:  # not on a submitted run's head: the side that submitted it was asked
        _asks(cfg, state, given)
    same_groups = {g for g in GROUPS if group_choices(point).get(g) == choices.get(g)}
    _restore_sections(cfg, saved, given, same_groups)
    return point, cfg


KEY = re.compile(r"[A-Za-z_][\w\-]{0,99}(?:\.[A-Za-z_][\w\-]{0,99}){0,9}")  # a config key's path


def _asks(cfg: DictConfig, state: Mapping[str, Any], given: set[str]) -> None:
    """A secret the experiment's run was given, and its resume command leaves out (`carried`):
    refused, naming it, unless given now (the state records its key, never its value)."""
    from omegaconf import OmegaConf

    recorded = state.get("asks")
    asked: list[Any] = recorded if isinstance(recorded, list) else []
    for key in asked[:100]:
        if not isinstance(key, str) or not KEY.fullmatch(key) or not _within(key, CARRIED_KEYS):
            continue
        if key not in given:
            how = (
                f"+{key}=..." if OmegaConf.select(cfg, key, default=None) is None else f"{key}=..."
            )
            raise ConfigError(
                key,
                "the experiment's run was given it, and a resume takes it from its command line "
                f"only (a secret: not in the printed command): give it again ({how})",
            )


def _saved_choices(
    state: Mapping[str, Any], saved: dict[str, Any], given: dict[str, str], path: Experiment
) -> dict[str, str]:
    """The experiment's group choices it may set again (RESUMED_GROUPS); the command line may not
    choose another workload or compute."""
    found = state.get("choices")
    recorded: dict[str, Any] = found if isinstance(found, dict) else {}
    choices = {g: str(c) for g, c in recorded.items() if g in RESUMED_GROUPS}
    if not choices and isinstance(saved.get("workload"), dict) and saved["workload"].get("name"):
        choices = {"workload": str(saved["workload"]["name"])}  # an experiment of an older rayflow
    for group, choice in choices.items():
        if not CHOICE.fullmatch(choice):
            raise ConfigError(
                "resume", f"{path} records {group}={choice[:100]!r}, which is not an option's name"
            )
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
