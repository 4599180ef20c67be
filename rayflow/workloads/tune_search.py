"""Ray Tune's param_space, scheduler and search algorithm, built from the YAML that
rayflow.workloads.search_space checks, and `check_tune_parts`, the preflight a tuning workload
calls: it builds them all once and throws them away, so that a parameter Tune's class does not
take, a value its constructor refuses or a space a searcher cannot convert is one line naming
the key before any cluster starts. Ray is imported inside the functions: the CLI's --help and
the schema do not pay for it.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rayflow.errors import ConfigError, first_error_line
from rayflow.schema.kinds import KeyedError
from rayflow.workloads.search_space import (
    EXTRAS,
    check_space,
    has_grid,
    sampler_args,
    sampler_name,
    scheduler_spec,
    search_alg_spec,
)

_SCHEDULERS = {  # name -> (module, class)
    "fifo": ("ray.tune.schedulers", "FIFOScheduler"),
    "asha": ("ray.tune.schedulers", "ASHAScheduler"),
    "hyperband": ("ray.tune.schedulers", "HyperBandScheduler"),
    "median_stopping": ("ray.tune.schedulers", "MedianStoppingRule"),
    "pbt": ("ray.tune.schedulers", "PopulationBasedTraining"),
    "pb2": ("ray.tune.schedulers.pb2", "PB2"),
}
_SEARCH_ALGS = {
    "random": ("ray.tune.search", "BasicVariantGenerator"),
    "optuna": ("ray.tune.search.optuna", "OptunaSearch"),
    "hyperopt": ("ray.tune.search.hyperopt", "HyperOptSearch"),
}
# Given by rayflow (TuneConfig's metric and mode, the param_space; max_concurrent is its own key):
# Tune refuses a metric set both on the scheduler and in TuneConfig, and a space given twice.
_GIVEN = {"self", "metric", "mode", "space", "max_concurrent"}
# Arguments that take a Python object (a function, an Optuna sampler or storage): no YAML gives one.
_OBJECTS = {"custom_explore_fn", "sampler", "storage"}


def _keyed(key: str, error: KeyedError) -> ConfigError:
    return ConfigError(f"{key}.{error.key}" if error.key else key, str(error))


def to_tune(space: Any) -> Any:
    """The Tune value of a checked space: samplers as `tune.<sampler>(...)` domains, dicts and
    lists recursed, other values as they are."""
    from ray import tune

    if sampler_name(space) is not None:
        name, kwargs = sampler_args(space)
        if name == "choice":
            kwargs["categories"] = [to_tune(v) for v in kwargs["categories"]]
        if name == "grid_search":
            kwargs["values"] = [to_tune(v) for v in kwargs["values"]]
        return getattr(tune, name)(**kwargs)
    if isinstance(space, Mapping):
        return {key: to_tune(value) for key, value in space.items()}
    # OmegaConf's ListConfig too
    if isinstance(space, Sequence) and not isinstance(space, (str, bytes)):
        return [to_tune(value) for value in space]
    return space


def _samplers(space: Any, path: str):
    """(dotted key, entry) of each sampler entry of a space, as a searcher sees them."""
    if sampler_name(space) is not None:
        yield path, space
    elif isinstance(space, Mapping):
        for key, value in space.items():
            yield from _samplers(value, f"{path}.{key}" if path else str(key))


def _need_extra(name: str, key: str) -> None:
    if name in EXTRAS:
        module, extra, package = EXTRAS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise ConfigError(
                key, f"{name} needs the {package} package: pip install 'rayflow[{extra}]'"
            ) from None


def _build(cls: type, name: str, params: dict, built: dict, key: str) -> Any:
    """cls(**built), after every name of `params` (the user's) is checked against cls's
    signature."""
    takes = [p for p in inspect.signature(cls).parameters if p not in _GIVEN]
    for param in params:
        if param in _OBJECTS and param in takes:
            raise ConfigError(
                f"{key}.{param}",
                f"{name}'s {param} takes a Python object, which a YAML config cannot give",
            )
        if param not in takes:
            usable = [p for p in takes if p not in _OBJECTS]
            raise ConfigError(
                f"{key}.{param}",
                f"{name} takes no parameter {param!r}; it takes: {', '.join(usable) or 'none'}",
            )
    from ray.tune.error import TuneError

    try:
        return cls(**built)
    except (
        TypeError,
        ValueError,
        AssertionError,
        TuneError,
    ) as error:  # Tune checks by assert, too
        raise ConfigError(key, f"{name}: {first_error_line(error)}") from None


def make_scheduler(
    value: Any,
    metric: str | None,
    mode: str | None,
    time_attr: str = "training_iteration",
    defaults: Mapping | None = None,
    prefix: str = "workload",
) -> Any:
    """The Tune scheduler of `workload.scheduler`, None for fifo (Tune's default).

    metric and mode are not passed: TuneConfig gives them to the scheduler, and Tune refuses
    both. time_attr, and `defaults` (e.g. the workload's max_t), apply where the user set none
    and the class takes them."""
    del metric, mode  # in the signature so that a caller's two calls read alike
    key = f"{prefix}.scheduler"
    try:
        name, params = scheduler_spec(value)
    except KeyedError as error:
        raise _keyed(key, error) from None
    _need_extra(name, key)
    module, cls_name = _SCHEDULERS[name]
    cls = getattr(importlib.import_module(module), cls_name)
    takes = inspect.signature(cls).parameters
    built = {k: v for k, v in {"time_attr": time_attr, **(defaults or {})}.items() if k in takes}
    built.update(params)
    if name == "pbt":  # the vocabulary's samplers become Tune domains; lists stay lists
        built["hyperparam_mutations"] = to_tune(params["hyperparam_mutations"])
    scheduler = _build(cls, name, params, built, key)
    return None if name == "fifo" else scheduler


def make_search_alg(
    value: Any, metric: str | None, mode: str | None, space: Any, prefix: str = "workload"
) -> Any:
    """The Tune search algorithm of `workload.search_alg`: None for plain random search, a
    BasicVariantGenerator when random search has max_concurrent or parameters, else the Searcher
    (in a ConcurrencyLimiter with max_concurrent). metric, mode and the space are not passed:
    the Tuner gives them (TuneConfig, param_space); `space` is checked against the searcher."""
    del metric, mode  # see make_scheduler
    key = f"{prefix}.search_alg"
    try:
        name, limit, params = search_alg_spec(value)
    except KeyedError as error:
        raise _keyed(key, error) from None
    module, cls_name = _SEARCH_ALGS[name]
    if name == "random":
        if limit is None and not params:
            return None
        cls = getattr(importlib.import_module(module), cls_name)
        return _build(cls, name, params, {**params, "max_concurrent": limit or 0}, key)
    _need_extra(name, key)
    if has_grid(space):  # Tune's searchers raise on a grid when the first trial is asked for
        raise ConfigError(
            f"{prefix}.search_space",
            "grid_search works with search_alg=random only; "
            f"{name} cannot search a grid: use choice",
        )
    cls = getattr(importlib.import_module(module), cls_name)
    searcher = _build(cls, name, params, params, key)
    entries = list(_samplers(space, ""))
    if not entries:  # HyperOpt raises on the first trial; Optuna would have nothing to search
        raise ConfigError(
            f"{prefix}.search_space",
            f"{name} needs at least one sampler to search; with none, use search_alg=random",
        )
    for path, entry in entries:  # one at a time, to name the key of a sampler it lacks
        try:
            cls.convert_search_space({"x": to_tune(entry)})
        except ValueError as error:
            raise ConfigError(
                f"{prefix}.search_space.{path}", f"{name}: {first_error_line(error)}"
            ) from None
    if limit is None:
        return searcher
    from ray.tune.search import ConcurrencyLimiter

    return ConcurrencyLimiter(searcher, max_concurrent=limit)


def check_tune_parts(
    w: Mapping,
    prefix: str = "workload",
    time_attr: str = "training_iteration",
    scheduler_defaults: Mapping | None = None,
) -> None:
    """The preflight of a tuning workload's search_space, scheduler and search_alg (keys of `w`,
    with metric and mode): ConfigError naming the key, before anything starts."""
    space = w.get("search_space")
    try:
        check_space(space)
    except KeyedError as error:
        raise _keyed(f"{prefix}.search_space", error) from None
    scheduler = make_scheduler(
        w.get("scheduler"), w.get("metric"), w.get("mode"), time_attr, scheduler_defaults, prefix
    )
    searcher = make_search_alg(w.get("search_alg"), w.get("metric"), w.get("mode"), space, prefix)
    # The Tuner's next step, on these throwaway objects: TuneConfig's metric and mode, and the
    # space. Optuna logs the study it creates; the run's own study logs it once, where it belongs.
    optuna_log = logging.getLogger("optuna")
    level = optuna_log.level
    optuna_log.setLevel(logging.WARNING)
    try:
        if scheduler is not None:
            scheduler.set_search_properties(w.get("metric"), w.get("mode"))
        if searcher is not None:
            searcher.set_search_properties(w.get("metric"), w.get("mode"), to_tune(space or {}))
    except (ValueError, AssertionError, RuntimeError) as error:
        raise ConfigError(prefix, first_error_line(error)) from None
    finally:
        optuna_log.setLevel(level)


def scheduler_class(name: str) -> type | None:
    """Tune's class of a scheduler name (its constructor's defaults say what a key left out means);
    None for a name whose extra is not installed."""
    module, cls_name = _SCHEDULERS[name]
    try:
        return getattr(importlib.import_module(module), cls_name)
    except ImportError:
        return None


__all__ = ["check_tune_parts", "make_scheduler", "make_search_alg", "scheduler_class", "to_tune"]
