"""The YAML vocabulary of a Tune search space, and the specs of a Tune scheduler and search
algorithm.

A search-space entry is a mapping with exactly one key, a sampler named after Ray Tune's function,
and Tune's own arguments: a list in Tune's order or a mapping of Tune's argument names
(`lr: {loguniform: [1.0e-4, 0.1]}`, `lr: {loguniform: {lower: 1.0e-4, upper: 0.1}}`);
`choice` and `grid_search` take their list itself (`batch: {choice: [64, 128]}`). Any other
mapping is a nested dict of the config, any other value passes through as it is. Every rule Tune
enforces late (an assert while sampling, a ValueError once trials start) is checked here, before
anything starts, with one line naming the key. Pure Python: rayflow.workloads.tune_search builds
the Tune objects from what this module has checked.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rayflow.schema.kinds import KeyedError

_REQUIRED = object()

# Tune's arguments in Tune's order, with their defaults. `base` is in Tune's signatures but has been
# deprecated and unused since Ray 2.x (a log-uniform distribution is the same in every base):
# it is accepted, so configs written for older Tune keep working, and dropped, as Ray only warns on
# it.
_ARGS: dict[str, tuple[tuple[str, Any], ...]] = {
    "uniform": (("lower", _REQUIRED), ("upper", _REQUIRED)),
    "quniform": (("lower", _REQUIRED), ("upper", _REQUIRED), ("q", _REQUIRED)),
    "loguniform": (("lower", _REQUIRED), ("upper", _REQUIRED), ("base", 10)),
    "qloguniform": (("lower", _REQUIRED), ("upper", _REQUIRED), ("q", _REQUIRED), ("base", 10)),
    "randn": (("mean", 0.0), ("sd", 1.0)),
    "qrandn": (("mean", _REQUIRED), ("sd", _REQUIRED), ("q", _REQUIRED)),
    "randint": (("lower", _REQUIRED), ("upper", _REQUIRED)),
    "qrandint": (("lower", _REQUIRED), ("upper", _REQUIRED), ("q", 1)),
    "lograndint": (("lower", _REQUIRED), ("upper", _REQUIRED), ("base", 10)),
    "qlograndint": (("lower", _REQUIRED), ("upper", _REQUIRED), ("q", _REQUIRED), ("base", 10)),
    "choice": (("categories", _REQUIRED),),
    "grid_search": (("values", _REQUIRED),),
}
_INTEGER = {"randint", "qrandint", "lograndint", "qlograndint"}
_LOG = {"loguniform", "qloguniform", "lograndint", "qlograndint"}
_LISTS = {"choice": "categories", "grid_search": "values"}

# The vocabulary for the docs: each sampler is `tune.<name>` with these arguments.
SAMPLERS: dict[str, str] = {
    "uniform": "[lower, upper]: a float in [lower, upper)",
    "quniform": (
        "[lower, upper, q]: a float in [lower, upper], a multiple of q (lower and upper multiples "
        "of q)"
    ),
    "loguniform": (
        "[lower, upper]: a float log-uniform in [lower, upper), 0 < lower (base: accepted, unused "
        "by Tune)"
    ),
    "qloguniform": (
        "[lower, upper, q]: log-uniform, a multiple of q, 0 < lower (base: accepted, unused by "
        "Tune)"
    ),
    "randn": "[mean, sd], default [0, 1]: a float from a normal distribution, sd > 0",
    "qrandn": "[mean, sd, q]: normal, a multiple of q, sd > 0",
    "randint": "[lower, upper]: an integer in [lower, upper)",
    "qrandint": (
        "[lower, upper, q], q default 1: a multiple of q in [lower, upper] (upper excluded when q "
        "is 1)"
    ),
    "lograndint": (
        "[lower, upper]: an integer log-uniform in [lower, upper), 0 < lower (base: accepted, "
        "unused)"
    ),
    "qlograndint": "[lower, upper, q]: log-uniform, a multiple of q in [lower, upper], 0 < lower",
    "choice": "[a, b, ...]: one of the values, drawn per trial",
    "grid_search": (
        "[a, b, ...]: one trial per value (per combination with the other grids); "
        "search_alg=random only"
    ),
}

SCHEDULERS: dict[str, str] = {  # name -> Tune's class
    "fifo": "FIFOScheduler",
    "asha": "ASHAScheduler",
    "hyperband": "HyperBandScheduler",
    "median_stopping": "MedianStoppingRule",
    "pbt": "PopulationBasedTraining",
    "pb2": "PB2",
}
SEARCH_ALGS: dict[str, str] = {
    "random": "BasicVariantGenerator",
    "optuna": "OptunaSearch",
    "hyperopt": "HyperOptSearch",
}
# What is an extra of rayflow: name -> (module that must import, the extra, the package to name)
EXTRAS: dict[str, tuple[str, str, str]] = {
    "optuna": ("optuna", "optuna", "optuna"),
    "hyperopt": ("hyperopt", "hyperopt", "hyperopt"),
    "pb2": ("sklearn", "pb2", "scikit-learn"),  # Ray 2.60's PB2 fits its GP with scikit-learn
}
# Keys rayflow gives Tune itself (TuneConfig, param_space): Tune refuses them twice.
_SET_BY_RAYFLOW = {
    "metric": "workload.metric",
    "mode": "workload.mode",
    "space": "workload.search_space",
}
_SPACE_EXAMPLE = "{lr: {loguniform: [1.0e-4, 1.0e-1]}}"


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _did_you_mean(name: Any, choices) -> str:
    close = (
        difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
        if isinstance(name, str)
        else []
    )
    return f" (did you mean {close[0]}?)" if close else ""


def sampler_name(value: Any) -> str | None:
    """The sampler an entry names (`{uniform: [0, 1]}` -> "uniform"), None for any other value."""
    if isinstance(value, Mapping) and len(value) == 1:
        (key,) = value.keys()
        if isinstance(key, str) and key in _ARGS:
            return key
    return None


def _entry_name(value: Mapping, path: str) -> str | None:
    """The sampler of a mapping, None for a nested dict; refuses what is almost an entry."""
    named = [k for k in value if isinstance(k, str) and k in _ARGS]
    if named and len(value) > 1:
        others = ", ".join(str(k) for k in value if k != named[0])
        raise KeyedError(
            path,
            f"a {named[0]} entry has exactly one key; remove {others} or nest the values elsewhere",
        )
    if named:
        return named[0]
    if len(value) == 1:
        ((key, args),) = value.items()
        hint = _did_you_mean(key, _ARGS)
        if hint and (isinstance(args, Mapping) or _is_list(args)):
            raise KeyedError(path, f"unknown sampler {key!r}{hint}; choose from {', '.join(_ARGS)}")
    return None


def _bind(name: str, raw: Any) -> dict:
    """Tune's keyword arguments from a list in Tune's order or a mapping of Tune's names."""
    spec = _ARGS[name]
    names = [n for n, _ in spec]
    usage = f"[{', '.join(names)}]"
    if name in _LISTS and _is_list(raw):
        raw = [raw]  # `{choice: [64, 128]}`: the list is the one argument
    if _is_list(raw):
        if len(raw) > len(spec):
            raise ValueError(f"{name} takes at most {len(spec)} arguments {usage}, got {len(raw)}")
        given = dict(zip(names, raw, strict=False))  # fewer values: the rest take their defaults
    elif isinstance(raw, Mapping):
        unknown = [k for k in raw if k not in names]
        if unknown:
            raise ValueError(
                f"{name} takes no argument {unknown[0]!r}; it takes {', '.join(names)}"
            )
        given = dict(raw)
    else:
        raise ValueError(f"{name} takes a list {usage} or a mapping of those names, got {raw!r}")
    missing = [n for n, default in spec if default is _REQUIRED and n not in given]
    if missing:
        raise ValueError(f"{name} needs {', '.join(missing)}: {usage}")
    return {n: given.get(n, default) for n, default in spec}


def _check_args(name: str, a: dict) -> None:
    """Tune's own rules for a sampler's arguments, which Tune checks late or by assert."""
    if name in _LISTS:
        values = a[_LISTS[name]]
        if not _is_list(values) or not values:
            raise ValueError(f"{name} takes a non-empty list of values, got {values!r}")
        return
    for arg in ("lower", "upper", "q"):
        if (
            arg in a
            and name in _INTEGER
            and (isinstance(a[arg], bool) or not isinstance(a[arg], int))
        ):
            raise ValueError(f"{name} {arg} must be an integer, got {a[arg]!r}")
    for arg in ("lower", "upper", "q", "mean", "sd", "base"):
        if arg in a and not _is_number(a[arg]):
            raise ValueError(f"{name} {arg} must be a number, got {a[arg]!r}")
    if "lower" in a and not a["lower"] < a["upper"]:
        raise ValueError(f"{name} lower ({a['lower']}) must be < upper ({a['upper']})")
    if name in _LOG and a["lower"] <= 0:
        raise ValueError(f"{name} lower must be > 0 (a log scale), got {a['lower']}")
    for arg in ("q", "sd"):
        if arg in a and a[arg] <= 0:
            raise ValueError(f"{name} {arg} must be > 0, got {a[arg]}")
    if "base" in a and (a["base"] <= 0 or a["base"] == 1):
        raise ValueError(f"{name} base must be > 0 and not 1, got {a['base']}")
    if name in ("quniform", "qloguniform"):  # Tune raises when it builds the domain
        for arg in ("lower", "upper"):
            ratio = a[arg] / a["q"]
            if not math.isclose(ratio, round(ratio)):
                raise ValueError(f"{name} {arg} ({a[arg]}) must be a multiple of q ({a['q']})")
    if (
        name in ("qrandint", "qlograndint")
        and math.ceil(a["lower"] / a["q"]) > a["upper"] // a["q"]
    ):
        raise ValueError(f"{name} has no multiple of q ({a['q']}) in [{a['lower']}, {a['upper']}]")


def sampler_args(entry: Any) -> tuple[str, dict]:
    """(sampler, Tune's keyword arguments) of one checked entry; `base` is dropped (see _ARGS)."""
    name = sampler_name(entry)
    if name is None:
        raise KeyedError("", f"not a sampler entry: {entry!r}; e.g. {{uniform: [0, 1]}}")
    try:
        args = _bind(name, entry[name])
        _check_args(name, args)
    except ValueError as error:
        raise KeyedError("", str(error)) from None
    args.pop("base", None)
    return name, args


def _check(value: Any, path: str, grid: str | None, mutation: bool = False) -> None:
    """Checks one value of a space. grid: why grid_search is refused here (None: it is allowed);
    mutation: a PBT mutation, whose leaves must be samplers or lists (Tune refuses constants)."""
    if isinstance(value, Mapping):
        name = _entry_name(value, path)
        if name is None:
            for key, item in value.items():
                _check(item, _join(path, key), grid, mutation)
            return
        if name == "grid_search" and grid:
            raise KeyedError(path, grid)
        try:
            args = _bind(name, value[name])
            _check_args(name, args)
        except ValueError as error:
            raise KeyedError(path, str(error)) from None
        if name in _LISTS:  # a value may be a dict with samplers of its own, as Tune resolves them
            for i, item in enumerate(args[_LISTS[name]]):
                _check(item, _join(path, f"{name}.{i}"), f"grid_search cannot be nested in {name}")
    elif _is_list(value):
        if mutation and not value:
            raise KeyedError(path, "a mutation's list of values must not be empty")
        for i, item in enumerate(value):
            _check(item, _join(path, i), grid)
    elif mutation:
        raise KeyedError(
            path,
            "a mutation is a sampler (e.g. {uniform: [0.001, 0.1]}) or a list of values, got "
            f"{value!r}",
        )


def check_space(space: Any, allow_grid: bool = True) -> None:
    """Raises KeyedError(key inside the space, one line) for the first malformed entry."""
    if space is None:
        return
    if not isinstance(space, Mapping):
        raise KeyedError(
            "", f"must be a mapping of names to values or samplers, e.g. {_SPACE_EXAMPLE}"
        )
    grid = None if allow_grid else "grid_search is not allowed here; use choice or a list"
    for key, value in space.items():  # top-level keys are parameter names, never samplers
        _check(value, str(key), grid)


def _has_grid(value: Any) -> bool:
    if sampler_name(value) == "grid_search":
        return True
    if isinstance(value, Mapping) and sampler_name(value) is None:
        return any(_has_grid(v) for v in value.values())
    return _is_list(value) and any(_has_grid(v) for v in value)


def has_grid(space: Any) -> bool:
    """Whether a space has a grid_search anywhere (outside choice values, where it is refused)."""
    return isinstance(space, Mapping) and any(_has_grid(v) for v in space.values())


def _named(value: Any, what: str, choices: Mapping, default: str) -> tuple[str, dict]:
    if value is None:
        return default, {}
    if isinstance(value, str):
        name, params, at = value, {}, ""
    elif isinstance(value, Mapping):
        params = dict(value)
        name, at = params.pop("name", None), "name"
        if name is None:
            raise KeyedError("name", f"missing: the {what}, one of {', '.join(choices)}")
    else:
        raise KeyedError(
            "",
            f"must be a {what} name ({', '.join(choices)}) or a mapping of name: and its "
            f"parameters, got {value!r}",
        )
    if name not in choices:
        raise KeyedError(
            at,
            f"unknown {what} {name!r}{_did_you_mean(name, choices)}; choose from "
            f"{', '.join(choices)}",
        )
    for key in params:
        if key in _SET_BY_RAYFLOW:
            raise KeyedError(
                str(key), f"rayflow gives Tune {_SET_BY_RAYFLOW[key]}; set that instead"
            )
    return name, params


def scheduler_spec(value: Any) -> tuple[str, dict]:
    """(scheduler, its parameters) from null (fifo), a name, or {name: ..., <parameters>}.
    Parameter names are checked against Tune's class by rayflow.workloads.tune_search."""
    name, params = _named(value, "scheduler", SCHEDULERS, "fifo")
    if name == "pbt":
        mutations = params.get("hyperparam_mutations")
        if not isinstance(mutations, Mapping) or not mutations:
            raise KeyedError(
                "hyperparam_mutations",
                f"pbt needs a mapping of the parameters it mutates, e.g. {_SPACE_EXAMPLE}",
            )
        for key, item in mutations.items():
            _check(
                item,
                f"hyperparam_mutations.{key}",
                "grid_search cannot be a mutation; use choice or a list",
                mutation=True,
            )
    if name == "pb2":
        bounds = params.get("hyperparam_bounds")
        if not isinstance(bounds, Mapping) or not bounds:
            raise KeyedError(
                "hyperparam_bounds",
                "pb2 needs a mapping of parameters to [low, high], e.g. {lr: [1.0e-4, 0.1]}",
            )
        _check_bounds(bounds, "hyperparam_bounds")
    return name, params


def _check_bounds(bounds: Mapping, path: str) -> None:
    for key, value in bounds.items():
        if isinstance(value, Mapping):  # nested, as the config is
            _check_bounds(value, _join(path, key))
        elif not (
            _is_list(value)
            and len(value) == 2
            and all(map(_is_number, value))
            and value[0] < value[1]
        ):
            raise KeyedError(
                _join(path, key), f"must be [low, high], two numbers with low < high; got {value!r}"
            )


def search_alg_spec(value: Any) -> tuple[str, int | None, dict]:
    """(search algorithm, max_concurrent or None, its parameters) from null (random), a name, or
    {name: ..., max_concurrent: ..., <parameters>}."""
    name, params = _named(value, "search algorithm", SEARCH_ALGS, "random")
    limit = params.pop("max_concurrent", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise KeyedError("max_concurrent", f"must be an integer >= 1 or null, got {limit!r}")
    return name, limit, params


__all__ = [
    "EXTRAS",
    "SAMPLERS",
    "SCHEDULERS",
    "SEARCH_ALGS",
    "check_space",
    "has_grid",
    "sampler_args",
    "sampler_name",
    "scheduler_spec",
    "search_alg_spec",
]
