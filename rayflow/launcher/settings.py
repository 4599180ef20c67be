"""From the `hydra.launcher` node to checked settings, each job's resources, and the rayflow config
of the chosen backend: composed as `backend=NAME` with the keys set beside it merged over that
backend's defaults, so a launcher's cluster is checked, rendered, started and stopped by the same
code as rayflow's own runs. Every error is a ConfigError naming the key as the user wrote it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rayflow.errors import ConfigError
from rayflow.launcher.node import backend_keys, own_keys
from rayflow.runtime.placement import Bundle, check_fits

PREFIX = "hydra.launcher"
RAY_NAMES = {"cpu": "CPU", "gpu": "GPU", "memory": "memory"}


@dataclass
class Settings:
    backend: str
    auth_mode: str
    resources: dict  # cpu, gpu, memory, custom: each job's unless its own config says otherwise
    job_resources_key: str | None
    max_concurrent: int | None
    on_failure: str
    schedule_timeout_s: float
    backend_values: dict  # the backend keys set beside `backend` (null ones left out: the default)


def read_settings(node: DictConfig) -> Settings:
    """The launcher's node, checked: its own keys against rayflow.launcher.keys, the backend keys
    against the chosen backend (a key of another backend is refused, naming whose it is)."""
    from rayflow.launcher.keys import Launcher
    from rayflow.schema import validate_section

    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    data: dict[str, Any] = {str(k): v for k, v in container.items()}  # a node's keys are strings
    keys = own_keys()
    # Hydra used _target_ already
    own = {k: v for k, v in data.items() if k in keys and k != "_target_"}
    validate_section(PREFIX, Launcher, own, data)
    values = backend_values(PREFIX, "launcher", own["backend"], data, set(own))
    return Settings(
        own["backend"],
        own["ray_auth_mode"],
        own["resources"],
        own["job_resources_key"],
        own["max_concurrent"],
        own["on_failure"],
        float(own["schedule_timeout_s"]),
        values,
    )


def backend_values(prefix: str, plugin: str, name: str, data: dict, own: set) -> dict:
    """The backend keys set beside a plugin's own (null ones left out: that backend's default),
    each checked to be a key of the chosen backend (another backend's is refused, naming whose it
    is). Shared by hydra/launcher=rayflow and hydra/sweeper=rayflow."""
    known = backend_keys()
    values = {k: v for k, v in data.items() if k not in own and v is not None}
    for key in values:
        if key not in known:
            raise ConfigError(
                f"{prefix}.{key}", f"not a key of the rayflow {plugin} or of any backend"
            )
        if name not in known[key]:
            raise ConfigError(
                f"{prefix}.{key}",
                f"not a key of backend={name} (it is one of {', '.join(known[key])})",
            )
    return values


def job_resources(settings: Settings, job_config: DictConfig, what: str) -> tuple[dict, dict]:
    """A job's Ray resources ({"CPU": 1.0, "GPU": 0.0, "memory": bytes, custom...}) and, for each,
    the key that set it: the launcher's `resources`, under the section `job_resources_key` of the
    job's own config where it has one."""
    from rayflow.launcher.keys import JobResources
    from rayflow.schema import validate_section

    merged, keys = (
        dict(settings.resources),
        {n: f"{PREFIX}.resources.{n}" for n in settings.resources},
    )
    key = settings.job_resources_key
    own = OmegaConf.select(job_config, key) if key else None
    if key and own is not None:
        section = OmegaConf.to_container(own, resolve=True) if isinstance(own, DictConfig) else own
        if not isinstance(section, dict):
            raise ConfigError(
                key, f"must be a mapping of cpu, gpu, memory, custom, got {section!r} ({what})"
            )
        merged.update(section)
        keys.update({n: f"{key}.{n!s}" for n in section})
        try:
            validate_section("", JobResources, merged, {})
        # named as the user set it: in the job's section, or the launcher's
        except ConfigError as err:
            where = key if err.key.split(".")[0] in section else f"{PREFIX}.resources"
            raise ConfigError(
                f"{where}.{err.key}", f"{str(err).split(': ', 1)[1]} ({what})"
            ) from None
    ray = {RAY_NAMES[n]: float(merged[n]) for n in ("cpu", "gpu", "memory") if merged.get(n)}
    ray.update({str(n): float(v) for n, v in (merged.get("custom") or {}).items() if v})
    names = {RAY_NAMES.get(n, n): k for n, k in keys.items() if n != "custom"}
    names.update(
        {
            str(n): f"{keys.get('custom', PREFIX + '.resources.custom')}.{n}"
            for n in merged.get("custom") or {}
        }
    )
    return ray, names


def rayflow_config(settings: Settings, gpu: bool) -> DictConfig:
    """The rayflow config whose backend section is the launcher's cluster: `backend=NAME`, the keys
    set beside it merged over its defaults; `compute=gpu` where a job asks for a GPU (the GPU
    worker types of vm and kuberay are rendered); no tracking of rayflow's own (the app has its)."""
    from hydra.core.singleton import Singleton

    from rayflow.orchestrator.compose import compose_config, config_errors

    state = Singleton.get_state()  # composing replaces Hydra's global state, which is the app's
    try:
        cfg = config_errors(
            lambda: compose_config(
                f"backend={settings.backend}",
                "tracking=none",
                f"compute={'gpu' if gpu else 'cpu'}",
                f"ray_auth_mode={settings.auth_mode}",
            )
        )
    finally:
        Singleton.set_state(state)
    # free-form mappings (spark_conf, overrides, ...) take new keys
    OmegaConf.set_struct(cfg, False)
    cfg.backend = OmegaConf.merge(cfg.backend, settings.backend_values)
    OmegaConf.set_struct(cfg, True)
    return cfg


def check_backend(cfg: DictConfig):
    """rayflow's own checks of the cluster (rayflow.orchestrator.preflight.check_backend), naming
    the launcher's keys as the user wrote them: hydra.launcher.*, not backend.*. Returns the backend
    (nothing started)."""
    from rayflow.orchestrator.preflight import check_backend as check

    try:
        return check(cfg)
    except ConfigError as err:
        raise ConfigError(_launcher_key(err.key), str(err).split(": ", 1)[1]) from None


def _launcher_key(key: str) -> str:
    if key == "ray_auth_mode":  # the launcher's own key of that name (auth off is refused)
        return f"{PREFIX}.ray_auth_mode"
    return f"{PREFIX}.{key[len('backend.') :]}" if key.startswith("backend.") else key


def check_fits_each(backend, jobs: list) -> None:
    """Each job alone against the largest node the cluster can have, where that is known before
    it starts (jobs beyond what the cluster holds at once wait for a free slot)."""
    names = {name for job in jobs for name in job.resources}
    nodes = backend.capacity(names)
    if nodes is None:
        return  # an existing or autoscaling cluster: watched while running (schedule_timeout_s)
    for job in jobs:
        try:
            check_fits([Bundle(job.what, job.resources, job.keys)], nodes, backend.name)
        except ConfigError as err:
            raise ConfigError(_launcher_key(err.key), str(err).split(": ", 1)[1]) from None
