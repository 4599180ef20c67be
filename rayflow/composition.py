"""From a command line to checked jobs: Hydra's composition, the sweep points of a multirun, and
the preflight that runs every check of every job before the first one starts. (Not
`compose.py`: `rayflow.compose(...)` is the public function this module would shadow.)

Only hydra and omegaconf are imported at module level; `check_config` imports a backend's and a
workload's module (ray, torch) only when it runs, so `--help` stays fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, TypeVar

from omegaconf import DictConfig

from rayflow.backends import ClusterBackend, backend_for
from rayflow.config import renamed_key_error
from rayflow.errors import ConfigError
from rayflow.job_files import check_upload
from rayflow.placement import check_fits
from rayflow.tracking import check_uri, missing_run
from rayflow.tuning import experiment_dir, read_state, resumed_folder
from rayflow.user_code import is_given
from rayflow.workloads import workload_for

CONFIG_MODULE = "rayflow.conf"
CONFIG_NAME = "config"

T = TypeVar("T")


@dataclass
class Job:
    """One job of an invocation: its command-line overrides and the config they compose to."""

    overrides: list[str]
    cfg: DictConfig


def compose_config(*overrides: str) -> DictConfig:
    """The config `python -m rayflow OVERRIDES` composes (unresolved, unchecked)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            return compose(CONFIG_NAME, overrides=replacing_mappings(list(overrides)))
    finally:
        GlobalHydra.instance().clear()


def replacing_mappings(overrides: list[str]) -> list[str]:
    """`workload.stop={...}` replaces a free-form mapping (a key of kind "a mapping, or null", e.g.
    rllib's stop) that its YAML fills by default, as it does one left null: Hydra would merge the
    two, and refuse the new keys besides (struct mode). A whole-mapping value becomes Hydra's
    delete-then-add (`~key`, `+key=...`); keys whose default is null or a section of declared keys
    keep Hydra's own assignment."""
    import yaml
    from importlib import resources

    from rayflow.schema.user_workloads import free_form_keys
    from rayflow.schema.workloads import WORKLOADS

    name = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "workload"), "cifar")
    model = WORKLOADS.get(name)
    shipped = resources.files(CONFIG_MODULE).joinpath("workload", f"{name}.yaml")
    if model is None or not shipped.is_file():
        return overrides
    defaults = yaml.safe_load(shipped.read_text()) or {}
    filled = {k for k in free_form_keys(model) if isinstance(defaults.get(k), dict) and defaults[k]}
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.startswith("workload.") and key[len("workload."):] in filled and value.lstrip().startswith("{"):
            out += [f"~{key}", f"+{key}={value}"]
        else:
            out.append(override)
    return out


def one_line(err: Exception) -> ConfigError:
    """Hydra's multi-line composition errors as one ConfigError that names the key."""
    from hydra.errors import MissingConfigException

    text = str(err)
    if isinstance(err, MissingConfigException) and err.options is not None:
        group = (err.missing_cfg_file or "").split("/")[0]
        name = (err.missing_cfg_file or "").split("/")[-1]
        return ConfigError(f"{group}={name}", f"unknown option; choose from {', '.join(err.options)}")
    match = re.search(r"Could not (?:override|append to|delete from) '([^']+)'", text)
    if match and renamed_key_error(match.group(1)):
        return renamed_key_error(match.group(1))
    if match:
        cause = str(err.__cause__ or "").splitlines()[0] if err.__cause__ else ""
        return ConfigError(match.group(1), f"unknown config key ({cause or text.splitlines()[0]})")
    match = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if match:
        return ConfigError(match.group(1), "a list of values needs -m (multirun) to sweep")
    return ConfigError("config", " ".join(line.strip() for line in text.splitlines() if line.strip()))


def config_errors(call: Callable[[], T]) -> T:
    """`call()`, with Hydra's and OmegaConf's errors as rayflow's one-line ConfigError. Only
    configuration errors are turned into it: anything else is a bug and keeps its traceback."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return call()
    except (HydraException, OmegaConfBaseException) as err:
        raise one_line(err) from None


def sweep_points(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists of each job a (multi)run launches, split by Hydra's own BasicSweeper
    (every point: a sweep is never cut short); hydra.* overrides are Hydra's, not a job's, but
    for hydra.searchpath: `hydra.searchpath=[file://conf]` adds the user's own options (a
    conf/workload/my_search.yaml) to every job's composition."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def is_hydra(override: str) -> bool:  # hydra.searchpath (the user's own config folder) composes the job
        key = override.split("=", 1)[0].lstrip("+~")
        return key.startswith("hydra") and key != "hydra.searchpath"

    if not multirun:
        return [[o for o in overrides if not is_hydra(o)]]
    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [[o for o in point if not is_hydra(o)] for batch in batches for point in batch]


def _local_files_ok(backend: ClusterBackend) -> bool:
    """Whether MLflow can write a file on this machine: this process writes it, or the nodes share it."""
    return backend.connects_driver or backend.shares_filesystem


def check_backend(cfg: DictConfig) -> ClusterBackend:
    """The checks of the cluster a config describes: every key against the schema, then the
    backend's own check(); starts nothing. Returns the backend."""
    from rayflow import schema

    backend = backend_for(cfg)
    schema.validate(cfg, local_paths=_local_files_ok(backend))
    backend.check()
    return backend


def check_config(cfg: DictConfig) -> ClusterBackend:
    """Every preflight check of one job; raises ConfigError, starts nothing. Returns the backend.

    First every key against its kind and the rules between keys (rayflow.schema), then what
    needs the machine or the cluster: the backend's own checks, the workload's, the demand
    against the cluster's nodes, the experiment to resume, the tracking store."""
    backend = check_backend(cfg)
    if backend.submits_jobs:  # the job imports what the config names, on the cluster
        for key, value in cfg.workload.items():
            if isinstance(value, str) and is_given(value):
                raise ConfigError(f"workload.{key}", f"a Python object given to rayflow.run ({value}) runs on backends that "
                                  f"connect this process (local, attach, spark); for backend={backend.name} put it in a "
                                  "module of your working_dir and name it module:function")
    workload = workload_for(cfg.workload)
    workload.check(cfg)
    if cfg.compute.device == "cuda":
        gpus = backend.cluster_gpus()
        if gpus is not None and gpus <= 0:
            raise ConfigError("compute", f"compute=gpu but backend {backend.name} has no CUDA device; use compute=cpu or compute=auto")
    bundles = workload.demand(cfg)
    threads = max((b.resources.get("CPU", 1.0) for b in bundles), default=1.0)
    backend.preload_worker_imports(workload.worker_imports(cfg), sum(b.count for b in bundles), int(threads) or 1)
    nodes = backend.capacity({k for b in bundles for k, v in b.resources.items() if v})
    if nodes is not None:  # else the running cluster is watched (PlacementWatch)
        check_fits(bundles, nodes, backend.name)
    if cfg.resume is not False:
        experiment_dir(cfg)
    if backend.submits_jobs and not cfg.dry_run:  # the files that go with the job fit Ray's upload limit
        check_upload(cfg, in_place=backend.shares_filesystem)
    # last: it may wait tracking.timeout_s for a server. A run submitted to nodes that do not
    # share this machine's files cannot write a local SQLite or file store.
    # A dry run only notes it (a provider's defaults alone still render).
    check_uri(cfg, local_files_ok=_local_files_ok(backend) or bool(cfg.dry_run))
    if cfg.resume is not False and cfg.tracking.enabled:
        _check_resumed_run(cfg)
    return backend


def _check_resumed_run(cfg: DictConfig) -> None:
    """A resumed experiment logs into its first run's MLflow parent run: the store must hold it
    (a relative sqlite:///mlflow.db from another directory is another store). Refused rather than
    started anew, so a resumed experiment's MLflow history stays in one run."""
    run_id = read_state(experiment_dir(cfg)).get("mlflow_run_id")
    if not run_id:
        return
    reason = missing_run(cfg, str(run_id))
    if reason:
        raise ConfigError("resume", f"the experiment's MLflow parent run {run_id} is not in tracking.uri: {reason}; "
                                    "resume from the directory of the first run or give its tracking.uri (or tracking=none)")


# -- resume: the experiment's own config, with the command line's keys on top --

GROUPS = ("backend", "workload", "compute", "tracking")  # the defaults list's choices
# What an experiment's state records of its config, and a resume restores: the sections of the
# trials (workload, data, seed, compute) and of where they ran (backend, tracking). The root's
# other keys (storage_path, schedule_timeout_s, ...) are the resume command's own.
RESUMED_KEYS = ("workload", "data", "seed", "compute", "backend", "tracking")
# Keys that shape what the trials run: Tuner.restore and Ray Train keep the experiment's own, so
# a different value on the resume command line is refused rather than silently ignored.
FIXED_KEYS = ("workload", "seed", "compute", "data.synthetic", "data.synthetic_train_size",
              "data.synthetic_test_size", "data.val_fraction", "data.md5")
# ... but for the workload's shipping keys: where the job's files come from may change.
CHANGEABLE_KEYS = ("workload.working_dir", "workload.excludes", "workload.py_modules", "workload.pip")


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def group_choices(overrides: list[str]) -> dict[str, str]:
    """The defaults-list choices a command line makes (`workload=tune`), and its
    hydra.searchpath (the user's own options): what an experiment's state records to compose
    its config again on resume."""
    return {_key(o): o.split("=", 1)[1] for o in overrides
            if "=" in o and (_key(o) in GROUPS or _key(o) == "hydra.searchpath")}


def _within(key: str, keys: tuple[str, ...] | set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in keys)


def resumed(point: list[str], cfg: DictConfig) -> tuple[list[str], DictConfig]:
    """A resume's overrides and config: the experiment's group choices and every key its state
    recorded, with the keys the command line gives on top. A key that shapes the trials and
    differs from the experiment's is refused, naming it; a secret the state holds masked comes
    from the command line or the environment (its interpolation), or is refused. `resume` becomes
    the folder, so every later look-up finds this same experiment."""
    from omegaconf import open_dict

    path = resumed_folder(cfg)
    state = read_state(path)
    saved = state.get("config", {})
    choices = state.get("choices") or {}
    if not choices and isinstance(saved.get("workload"), dict) and saved["workload"].get("name"):
        choices = {"workload": str(saved["workload"]["name"])}  # an experiment of an older rayflow
    given = group_choices(point)
    for group, choice in choices.items():
        if group in ("workload", "compute") and given.get(group, choice) != choice:
            raise ConfigError(group, f"cannot change on resume: {path} ran {group}={choice} (leave it out, "
                                     "or leave out resume= to start a new experiment)")
    point = [f"{g}={c}" for g, c in choices.items() if g not in given] + [o for o in point if _key(o) != "resume"]
    point.append(f"resume={path}")
    cfg = compose_config(*point)
    keys = {_key(o) for o in point if "=" in o or o.startswith("~")} - set(GROUPS)
    same_groups = {g for g in GROUPS if group_choices(point).get(g) == choices.get(g)}
    for key in sorted(keys):  # first: a resume that changes the trials is refused, whatever else it lacks
        _check_unchanged(cfg, key, saved, path)
    with open_dict(cfg):
        for section in RESUMED_KEYS:
            if section not in saved or (section in GROUPS and section not in same_groups):
                continue
            if isinstance(saved[section], dict):  # key by key: a mapping in it is the experiment's whole
                for key, value in saved[section].items():
                    _restore(cfg, f"{section}.{key}", value, keys)
            else:
                _restore(cfg, section, saved[section], keys)
    return point, cfg


def _restore(cfg: DictConfig, key: str, value, given: set[str]) -> None:
    """The saved `value` of `key` into cfg, but for the keys the command line gives."""
    from omegaconf import OmegaConf

    from rayflow.redaction import REDACTED

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
            given = f"+{key}=..." if now is absent else f"{key}=..."  # a key the run added, or one of rayflow's
            raise ConfigError(key, "its value was masked in the experiment's saved state: give it again on the "
                                   f"command line ({given}) or in the environment it reads")
        return
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def _holds(value, marker: str) -> bool:
    if isinstance(value, dict):
        return any(_holds(v, marker) for v in value.values())
    if isinstance(value, list):
        return any(_holds(v, marker) for v in value)
    return isinstance(value, str) and marker in value


def _check_unchanged(cfg: DictConfig, key: str, saved: dict, path) -> None:
    """A key of the resume command line that shapes the trials must keep the experiment's value."""
    from omegaconf import OmegaConf

    from rayflow.config import to_container

    if not _within(key, FIXED_KEYS) or _within(key, CHANGEABLE_KEYS):
        return
    node: object = saved
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return  # the experiment did not record it: nothing to compare with
        node = node[part]
    now = to_container(OmegaConf.select(cfg, key, default=None))
    if now != node:
        raise ConfigError(key, f"cannot change on resume: {path} ran with {node!r} (leave it out, "
                               "or leave out resume= to start a new experiment)")


def preflight(overrides: list[str], multirun: bool = False) -> list[Job]:
    """Compose and check every job of the command line before any starts: bad input anywhere in
    a sweep is one ConfigError naming the key, with nothing started. A resume composes the
    experiment's own config (resumed)."""
    points = config_errors(lambda: sweep_points(list(overrides), multirun))
    jobs = []
    for point in points:
        cfg = config_errors(lambda: compose_config(*point))
        if cfg.resume is not False:
            point, cfg = config_errors(lambda: resumed(point, cfg))
        config_errors(lambda: check_config(cfg))
        jobs.append(Job(point, cfg))
    return jobs
