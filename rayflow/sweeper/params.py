"""`hydra.sweeper.params` and a multirun's command line, read as Hydra's Optuna sweeper reads them,
translated into the search-space vocabulary rayflow already checks and builds
(rayflow.workloads.search_space, rayflow.workloads.tune_search): no second parser.

    choice(a, b) / a,b / shuffle(...)        -> {choice: [a, b]}
    range(1, 5)             (integers)       -> {randint: [1, 6]}          1..5, stop included
    range(1, 9, step=2), range(0.5, 2.5, step=0.5) -> {choice: [1, 3, 5, 7, 9]}, ...
    interval(0, 1)                           -> {uniform: [0.0, 1.0]}
    int(interval(1, 5))                      -> {randint: [1, 6]}
    tag(log, interval(1e-4, 1e-1))           -> {loguniform: [0.0001, 0.1]}
    tag(log, int(interval(1, 64)))           -> {lograndint: [1, 65]}
    {loguniform: [1e-4, 1e-1]}  (in YAML)    -> as it is: Tune's vocabulary of workload.search_space
    5, ~z, +w=5                              -> the same override in every trial

A range includes its stop, as Optuna's sweeper reads it (an IntDistribution or a stepped
FloatDistribution from start to stop), so the params of a Hydra app that sweeps with
`hydra/sweeper=optuna` keep their meaning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rayflow.errors import ConfigError
from rayflow.schema.kinds import KeyedError
from rayflow.workloads.search_space import check_space, sampler_name

PARAMS = "hydra.sweeper.params"
PREFIXES = ("++", "+")  # Hydra's add and force-add: kept for the trial's override, not its name


@dataclass
class Search:
    """What the trials search and what each of them gets as it is."""

    space: dict = field(default_factory=dict)  # Tune key -> rayflow search-space entry
    names: dict = field(default_factory=dict)  # Tune key -> the override key (`+w`, `db.lr`)
    fixed: list = field(default_factory=list)  # overrides every trial gets (`y=0`, `~z`)

    def overrides(self, config: Mapping) -> list[str]:
        """A trial's command line: its sampled values, then the fixed overrides."""
        sampled = [f"{self.names[k]}={hydra_value(config[k])}" for k in self.names if k in config]
        return [*sampled, *self.fixed]

    def params(self, config: Mapping) -> dict:
        """A trial's sampled values by the names the user wrote (optimization_results.yaml)."""
        return {self.names[k]: config[k] for k in self.names if k in config}


def read_search(params: Mapping | None, arguments: list[str]) -> Search:
    """The search of the sweeper's `params` node and the multirun's command line (which wins,
    as in Hydra's sweepers); ConfigError naming the key for anything that cannot be searched."""
    search = Search()
    for key, value in (params or {}).items():
        where = f"{PARAMS}.{key}"
        if isinstance(value, str):
            _add(search, _parse(f"{key}={value}", where), where)
        elif isinstance(value, Mapping) and sampler_name(value) is not None:
            _set(search, str(key), dict(value), where)
        elif isinstance(value, Mapping):
            try:  # almost a sampler (a typo) is named as such
                check_space({key: value})
            except KeyedError as err:
                raise ConfigError(where, str(err)) from None
            raise ConfigError(
                where,
                "a mapping here is one sampler of Tune's vocabulary (e.g. {loguniform: [1.0e-4, "
                "0.1]}); write a nested key dotted (db.lr: ...)",
            )
        else:
            _add(search, _parse(f"{key}={hydra_value(value)}", where), where)
    for argument in arguments:
        override = _parse(argument, argument.split("=", 1)[0])
        _add(search, override, str(override.get_key_element()))
    try:
        check_space(search.space)
    except KeyedError as err:
        key = err.key.split(".", 1)[0] if err.key else ""
        raise ConfigError(_where(search, key), str(err)) from None
    return search


def _where(search: Search, key: str) -> str:
    return f"{PARAMS}.{search.names.get(key, key)}"


def _parse(text: str, where: str) -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return OverridesParser.create().parse_overrides([text])[0]
    except HydraException as err:
        raise ConfigError(where, str(err).strip().splitlines()[0]) from None


def _add(search: Search, override: Any, where: str) -> None:
    """One parsed override: a search entry when it sweeps, else fixed."""
    if override.is_delete() or not override.is_sweep_override():
        key = override.get_key_element()
        search.fixed = [f for f in search.fixed if f.split("=", 1)[0] != key]
        search.fixed.append(override.input_line)
        _drop(search, key)
        return
    _set(search, str(override.get_key_element()), _entry(override, where), where)


def _set(search: Search, name: str, entry: dict, where: str) -> None:
    key = name.lstrip("+")
    if not key or key.startswith("~"):
        raise ConfigError(where, "a searched key is a config key (a deletion ~key is not searched)")
    _drop(search, name)
    search.fixed = [f for f in search.fixed if f.split("=", 1)[0].lstrip("+~") != key]
    search.space[key] = entry
    search.names[key] = name


def _drop(search: Search, name: str) -> None:
    key = name.lstrip("+~")
    search.space.pop(key, None)
    search.names.pop(key, None)


def _entry(override: Any, where: str) -> dict:
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    value = override.value()
    if isinstance(value, ChoiceSweep):
        return {"choice": list(value.list)}
    if isinstance(value, RangeSweep):
        if value.shuffle:  # shuffle(range(...)): the values Hydra would list, in any order
            return {"choice": list(override.sweep_iterator())}
        return _range(value.start, value.stop, value.step, where)
    if isinstance(value, IntervalSweep):
        start, end = value.start, value.end
        assert start is not None and end is not None  # the grammar's interval has both
        log = "log" in value.tags
        if isinstance(start, int) and isinstance(end, int):  # int(interval(...)): end included
            return {"lograndint" if log else "randint": [start, end + 1]}
        return {"loguniform" if log else "uniform": [float(start), float(end)]}
    raise ConfigError(
        where,
        f"{override.input_line!r} is not searched by hydra/sweeper=rayflow: use choice(...), "
        "range(...), interval(...), tag(log, interval(...)) or a comma list",
    )


def _range(start: Any, stop: Any, step: Any, where: str) -> dict:
    """A range from start to stop, stop included (Optuna's sweeper's IntDistribution and stepped
    FloatDistribution)."""
    if not step:
        raise ConfigError(where, "range(...) needs a step other than 0")
    if all(isinstance(v, int) for v in (start, stop, step)) and step == 1:
        if stop < start:
            raise ConfigError(where, f"range({start}, {stop}) is empty: stop is below start")
        return {"randint": [start, stop + 1]}
    count = math.floor((stop - start) / step + 1e-9) + 1
    if count < 1:
        raise ConfigError(where, f"range({start}, {stop}, step={step}) holds no value")
    if count > 100_000:
        raise ConfigError(where, f"range({start}, {stop}, step={step}) holds {count} values")
    floats = any(isinstance(v, float) for v in (start, stop, step))
    values = [start + i * step for i in range(count)]
    return {"choice": [round(v, 12) if floats else v for v in values]}


def hydra_value(value: Any) -> str:
    """A value as the override grammar reads it back as that same value: a string unquoted where
    the grammar reads it as that string, else single-quoted with escapes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text and _reads_back(text, text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _reads_back(text: str, value: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([f"k={text}"])[0]
    except HydraException:
        return False
    return not parsed.is_sweep_override() and parsed.value() == value
