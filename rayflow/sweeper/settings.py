"""From the `hydra.sweeper` node to checked settings and the rayflow config of the search: composed
as rayflow's own `backend=NAME workload=tune` run, so the search's cluster, its Tune run, MLflow and
the teardown are the same code as `python -m rayflow`'s. Every error names the key as the user
wrote it (`hydra.sweeper.*`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rayflow.errors import ConfigError
from rayflow.launcher.settings import backend_values
from rayflow.sweeper.node import own_keys
from rayflow.sweeper.params import Search

PREFIX = "hydra.sweeper"
EXPERIMENT = "search"  # Tune's experiment folder, under storage_path (by default the sweep dir)
# rayflow's key -> the sweeper's, for messages
KEYS = {
    "workload.search_space": "params",
    "workload.num_samples": "n_trials",
    "workload.mode": "direction",
    "workload.search_alg.max_concurrent": "max_concurrent",
    "workload.resources_per_trial": "resources",
    "tracking.uri": "tracking_uri",
    "tracking.experiment": "experiment",
}
# the search algorithms' own names for their seed
SEED_ARGS = {"random": "random_state", "optuna": "seed", "hyperopt": "random_state_seed"}


@dataclass
class Settings:
    own: dict  # the sweeper's own keys, checked
    backend_values: dict  # the backend keys set beside `backend` (null ones left out)


def read_settings(node: DictConfig) -> Settings:
    from rayflow.schema import validate_section
    from rayflow.sweeper.keys import Sweeper

    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    data: dict[str, Any] = {str(k): v for k, v in container.items()}
    keys = own_keys()
    own = {k: v for k, v in data.items() if k in keys and k not in ("_target_", "_recursive_")}
    validate_section(PREFIX, Sweeper, own, data)
    values = backend_values(PREFIX, "sweeper", own["backend"], data, set(keys))
    return Settings(_optuna_keys(own), values)


# The Optuna sweeper's samplers, by the end of their `_target_`, as search algorithms here
SAMPLERS = {"TPESampler": "optuna", "RandomSampler": "random"}


def _optuna_keys(own: dict) -> dict:
    """The Optuna sweeper's keys as this sweeper's own, where those are left at their defaults:
    sampler -> search_alg and seed, n_jobs -> max_concurrent, study_name -> experiment."""
    own = dict(own)
    sampler = own.get("sampler") or {}
    if sampler:
        target = str(sampler.get("_target_") or "").rsplit(".", 1)[-1]
        if target and target not in SAMPLERS:
            raise ConfigError(
                f"{PREFIX}.sampler._target_",
                f"{sampler.get('_target_')!r} is not searched here; use "
                "optuna.samplers.TPESampler or RandomSampler, or set search_alg",
            )
        if target and own["search_alg"] == "random":
            own["search_alg"] = SAMPLERS[target]
        if own["seed"] is None and sampler.get("seed") is not None:
            own["seed"] = sampler["seed"]
    if own["max_concurrent"] is None:
        own["max_concurrent"] = own.get("n_jobs")
    if own["experiment"] is None:
        own["experiment"] = own.get("study_name")
    return own


def sweeper_key(key: str) -> str:
    """A rayflow key of the composed config as the sweeper's user wrote it."""
    for ours, theirs in KEYS.items():
        if key == ours or key.startswith(ours + "."):
            return f"{PREFIX}.{theirs}{key[len(ours) :]}"
    for section in ("workload.", "backend."):
        if key.startswith(section):
            return f"{PREFIX}.{key[len(section) :]}"
    return f"{PREFIX}.{key}"


def _named(value: Any) -> dict:
    """A scheduler's or search algorithm's value as a mapping with `name`."""
    if isinstance(value, dict):
        return dict(value)
    return {"name": value}


@dataclass
class SearchConfig:
    cfg: DictConfig  # the search's rayflow config
    overrides: list[str]  # the command line that composes it (for a driver on a cluster's head)

    def set(self, key: str, value: Any) -> None:
        """A key set after composing, in the config and on its command line."""
        from rayflow.sweeper.params import hydra_value

        OmegaConf.set_struct(self.cfg, False)
        OmegaConf.update(self.cfg, key, value, merge=False)
        OmegaConf.set_struct(self.cfg, True)
        self.overrides.append(f"{key}={hydra_value(value)}")


def _composed(choices: list[str]) -> DictConfig:
    from hydra.core.singleton import Singleton

    from rayflow.orchestrator.compose import compose_config, config_errors

    state = Singleton.get_state()  # composing replaces Hydra's global state, which is the app's
    try:
        return config_errors(lambda: compose_config(*choices))
    finally:
        Singleton.set_state(state)


def _written(cfg: DictConfig) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def _as_overrides(cfg: DictConfig, base: DictConfig, choices: list[str]) -> list[str]:
    """`choices`, then each key of `cfg` outside `backend` (the head joins its own cluster) whose
    value differs from the composed `base`'s, in the override grammar."""
    from rayflow.sweeper.params import hydra_value

    # as written: the base's `${now:...}` and the like are its own, left to compose again
    mine, theirs = _written(cfg), _written(base)
    changed = []
    for key, value in mine.items():
        if key == "backend":
            continue
        if isinstance(value, dict) and isinstance(theirs.get(key), dict):
            changed += [
                f"{key}.{k}={hydra_value(v)}" for k, v in value.items() if theirs[key].get(k) != v
            ]
        elif theirs.get(key) != value:
            changed.append(f"{key}={hydra_value(value)}")
    return [*choices, *changed]


def rayflow_config(
    settings: Settings, search: Search, trainable: str, sweep_dir: str, job_name: str
) -> SearchConfig:
    """The rayflow config of the search: its backend as the launcher composes one, workload=tune
    with the sweeper's keys (the trainable: `trainable`, a registered Hydra-job function)."""
    own = settings.own
    choices = [
        f"backend={own['backend']}",
        "workload=tune",
        f"tracking={own['tracking']}",
        f"compute={'gpu' if own['resources'].get('gpu') else 'cpu'}",
        f"ray_auth_mode={own['ray_auth_mode']}",
    ]
    base = _composed(choices)
    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, False)  # free-form mappings take new keys
    cfg.backend = OmegaConf.merge(cfg.backend, settings.backend_values)
    _workload(cfg.workload, own, search, trainable)
    if own["tracking"] == "mlflow":
        cfg.tracking.uri = own["tracking_uri"]
        cfg.tracking.experiment = own["experiment"] or job_name
        cfg.tracking.log_best_checkpoint = False
    cfg.storage_path = own["storage_path"] or sweep_dir
    cfg.experiment_name = EXPERIMENT
    cfg.verbose = own["verbose"]
    cfg.seed = own["seed"] or 0
    if own["resume"]:
        cfg.resume = experiment_location(cfg)
    OmegaConf.set_struct(cfg, True)
    return SearchConfig(cfg, _as_overrides(cfg, base, choices))


def _workload(workload: DictConfig, own: dict, search: Search, trainable: str) -> None:
    """workload=tune's keys from the sweeper's: the search, its trials' resources, the trainable."""
    search_alg = _named(own["search_alg"])
    seed_arg = SEED_ARGS.get(str(search_alg.get("name")))
    if own["seed"] is not None and seed_arg and seed_arg not in search_alg:
        search_alg[seed_arg] = own["seed"]
    if own["max_concurrent"] is not None:  # the algorithm's limit (Tune's own for a wrapped one)
        search_alg.setdefault("max_concurrent", own["max_concurrent"])
    scheduler = _named(own["scheduler"])
    if scheduler.get("name") in ("pbt", "pb2"):
        raise ConfigError(
            f"{PREFIX}.scheduler",
            f"{scheduler['name']} restarts trials from their checkpoints, which a Hydra task "
            "does not save; use asha, hyperband or median_stopping",
        )
    res = own["resources"]
    workload.name = "hydra_sweep"
    workload.trainable = trainable
    workload.search_space = search.space
    workload.metric = own["metric"]
    workload.mode = "min" if own["direction"] == "minimize" else "max"
    workload.num_samples = own["n_trials"]
    workload.scheduler = None if scheduler == {"name": "fifo"} else scheduler
    workload.search_alg = None if search_alg == {"name": "random"} else search_alg
    workload.time_budget_s = own["time_budget_s"]
    workload.max_failures = own["max_failures"]
    workload.resources_per_trial = {
        "cpu": res.get("cpu", 1),
        "gpu": res.get("gpu") or 0,
        "memory": res.get("memory"),
        "custom": res.get("custom") or None,
    }


def experiment_location(cfg: DictConfig) -> str:
    return f"{str(cfg.storage_path).rstrip('/')}/{EXPERIMENT}"
