"""From a command line to configs: Hydra's composition, the sweep points of a multirun, Hydra's
errors as one line naming the key, and the model of each section of a composed config (the
backend's and the workload's from their registries) that rayflow.schema checks it with.

Only hydra and omegaconf are imported at module level, so `--help` stays fast.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from omegaconf import DictConfig

from rayflow.backends import REGISTRY as BACKENDS
from rayflow.backends import backend_keys, backends, plugin_defaults
from rayflow.errors import ConfigError
from rayflow.runtime import hydra_internals
from rayflow.schema.values import renamed_key_error
from rayflow.workloads import workload_keys

CONFIG_MODULE = "rayflow.conf"
CONFIG_NAME = "config"

T = TypeVar("T")


def compose_config(*overrides: str) -> DictConfig:
    """The config `python -m rayflow OVERRIDES` composes (unresolved, unchecked)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    plugin_options(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"), _app_schema_aside():
            return compose(CONFIG_NAME, overrides=replacing_mappings(list(overrides)))
    except ConfigCompositionException as err:
        found = re.search(r"Could not override '([^']+)'", str(err))
        if not found or renamed_key_error(found.group(1)) is not None:
            raise
        from rayflow.orchestrator.unknown_keys import unknown_key_error

        raise unknown_key_error(found.group(1), list(overrides), compose_config) from None
    finally:
        GlobalHydra.instance().clear()


def plugin_options(overrides: Sequence[str], every: bool = False) -> None:
    """The option `backend/<name>` of each backend plugin that `overrides` choose (`every`: of every
    plugin installed, for `--help`'s list), stored in Hydra's ConfigStore, where Hydra finds it
    beside rayflow's own options (conf/backend/*.yaml): its keys at the defaults its keys' model
    declares (rayflow.backends.plugin_defaults). Plugins are looked for only when a name chosen is
    not rayflow's own."""
    chosen = {
        name.strip()
        for override in overrides
        if "=" in override and override.split("=", 1)[0].lstrip("+~") == "backend"
        for name in override.split("=", 1)[1].split(",")
    }
    if not every and chosen <= set(BACKENDS):
        return
    from hydra.core.config_store import ConfigStore

    plugins = [name for name in backends() if name not in BACKENDS]
    for name in plugins if every else sorted(chosen & set(plugins)):
        try:
            node = plugin_defaults(name)
        except ConfigError:
            if every:  # `--help` lists what composes; a broken plugin is refused where chosen
                continue
            raise
        ConfigStore.instance().store(group="backend", name=name, node=node, provider="rayflow")


@contextlib.contextmanager
def _app_schema_aside() -> Iterator[None]:
    """Inside a Hydra app (hydra/launcher=rayflow, hydra/sweeper=rayflow), the app's own
    ConfigStore entry `config` (Hydra's structured-config tutorial's name) is set aside while
    rayflow's root config, of the same name, composes: Hydra would take it as that config's schema
    and merge the app's keys into rayflow's."""
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    entry = repo.pop(f"{CONFIG_NAME}.yaml", None)
    try:
        yield
    finally:
        if entry is not None:
            repo[f"{CONFIG_NAME}.yaml"] = entry


def default_choice(group: str) -> str:
    """The option the root config's defaults list chooses for `group` (conf/config.yaml)."""
    from importlib import resources

    import yaml

    root = yaml.safe_load(
        resources.files(CONFIG_MODULE).joinpath(f"{CONFIG_NAME}.yaml").read_text()
    )
    for entry in root.get("defaults", []):
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    raise LookupError(f"conf/{CONFIG_NAME}.yaml chooses no {group}")


def replacing_mappings(overrides: list[str]) -> list[str]:
    """`workload.stop={...}` replaces a free-form mapping (a key of kind "a mapping, or null", e.g.
    rllib's stop) that its YAML fills by default, as it does one left null: Hydra would merge the
    two, and refuse the new keys besides (struct mode). A whole-mapping value becomes Hydra's
    delete-then-add (`~key`, `+key=...`); keys whose default is null or a section of declared keys
    keep Hydra's own assignment."""
    from importlib import resources

    import yaml

    from rayflow.workloads import REGISTRY
    from rayflow.workloads.keys import free_form_keys

    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "workload"]
    name = chosen[-1] if chosen else default_choice("workload")
    shipped = resources.files(CONFIG_MODULE).joinpath("workload").joinpath(f"{name}.yaml")
    if name not in REGISTRY or not shipped.is_file():
        return overrides
    model = workload_keys(name)
    defaults = yaml.safe_load(shipped.read_text()) or {}
    filled = {k for k in free_form_keys(model) if isinstance(defaults.get(k), dict) and defaults[k]}
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if (
            sep
            and key.startswith("workload.")
            and key[len("workload.") :] in filled
            and value.lstrip().startswith("{")
        ):
            out += [f"~{key}", f"+{key}={value}"]
        else:
            out.append(override)
    return out


# An override's key as the grammar writes it: `+a.b`, `~a`, `++a/b@pkg`
_OVERRIDE_KEY = re.compile(r"[+~]{0,2}(?P<key>[\w.\-/@:\[\]]+)(?==|$)")
GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic"


def unparsable(override: str, hydra_says: str) -> ConfigError:
    """An override Hydra's grammar refused, naming its key. Hydra's message quotes the value from
    where parsing failed to its end: where the key names a secret (`+workload.hf_token=[secret`),
    no part of the value is shown, only what is open in it."""
    from rayflow.security.secret_names import is_secret_name, secret_word

    found = _OVERRIDE_KEY.match(override)
    key = found.group("key") if found else "config"
    value = override.partition("=")[2]
    hint = "quote a value with brackets, braces, quotes or spaces whole: key='...'"
    # a secret's key, or a secret's name inside the value (`+workload.env={HF_TOKEN: [x`)
    names = [key, *re.findall(r"[A-Za-z_][\w\-]*", value)] if found else []
    if secret_word(tuple(key.split("."))) is not None or any(map(is_secret_name, names[1:])):
        open_ = [f"a {c}" for c, d in ("[]", "{}") if value.count(c) > value.count(d)]
        open_ += [f"a {q}" for q in "\"'" if value.count(q) % 2]
        what = f" ({' and '.join(open_)} left open)" if open_ else ""
        return ConfigError(
            key, f"cannot parse its value{what}; not shown, it holds a secret; {hint} ({GRAMMAR})"
        )
    said = hydra_says.strip().splitlines()[0] if hydra_says.strip() else "not the grammar's"
    return ConfigError(key, f"cannot parse its value: {said}; {hint} ({GRAMMAR})")


def one_line(err: Exception) -> ConfigError:
    """Hydra's multi-line composition errors as one ConfigError that names the key."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, OverrideParseException):
        return unparsable(err.override, err.message)
    text = str(err)
    if isinstance(err, MissingConfigException) and err.options is not None:
        group = (err.missing_cfg_file or "").split("/")[0]
        name = (err.missing_cfg_file or "").split("/")[-1]
        options = list(err.options)
        if group == "backend":  # plugins not chosen are not Hydra's options (plugin_options)
            options += [n for n in backends() if n not in options]
        return ConfigError(f"{group}={name}", f"unknown option; choose from {', '.join(options)}")
    match = re.search(r"Could not (?:override|append to|delete from) '([^']+)'", text)
    renamed = renamed_key_error(match.group(1)) if match else None
    if renamed is not None:
        return renamed
    if match:
        cause = str(err.__cause__ or "").splitlines()[0] if err.__cause__ else ""
        return ConfigError(match.group(1), f"unknown config key ({cause or text.splitlines()[0]})")
    match = re.search(r"Ambiguous value for argument '([^']+)'", text)
    if match:
        return ConfigError(match.group(1), "a list of values needs -m (multirun) to sweep")
    return ConfigError(
        "config", " ".join(line.strip() for line in text.splitlines() if line.strip())
    )


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
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def is_hydra(
        override: str,
    ) -> bool:  # hydra.searchpath (the user's own config folder) composes the job
        key = override.split("=", 1)[0].lstrip("+~")
        return key.startswith("hydra") and key != "hydra.searchpath"

    if not multirun:
        return [[o for o in overrides if not is_hydra(o)]]
    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = hydra_internals.sweep_batches(parsed)
    return [[o for o in point if not is_hydra(o)] for batch in batches for point in batch]


def section_models(cfg: dict[str, Any]) -> dict[str, Any]:
    """The model of each section of a composed config (plain, resolved): the root's own keys,
    compute and tracking (rayflow.schema.root), the chosen backend's and workload's (their
    registries), and the root sections the workload brings (cifar and ddp: `data`)."""
    from rayflow.schema import root_models
    from rayflow.workloads import KINDS
    from rayflow.workloads import REGISTRY as WORKLOADS

    models = root_models(cfg)
    workload = cfg.get("workload", {})
    # a preset, or a kind under the user's own name
    if workload.get("name") in WORKLOADS or workload.get("kind") in KINDS:
        model = workload_keys(workload)
        models["workload"] = model
        models.update(getattr(model, "sections", {}))
    # rayflow's own or a plugin's (those looked for only when the name is not rayflow's)
    name = cfg.get("backend", {}).get("name")
    if name in BACKENDS or name in backends():
        models["backend"] = backend_keys(name)
    return models


def plain(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as plain Python, resolved: what the schema and its models read."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return {str(key): value for key, value in data.items()}


def validate(cfg: DictConfig, local_paths: bool = True) -> None:
    """Every key of a composed config against its kind and the rules between keys (rayflow.schema):
    the first that is not is one ConfigError naming it."""
    from rayflow import schema

    data = plain(cfg)
    schema.validate(data, section_models(data), local_paths=local_paths)
