"""`python -m rayflow` / `rayflow`: Hydra's entry point, with a preflight in front.

The preflight composes the config of every job the command line asks for (each point of
a `-m` sweep) and runs every check before any job starts, so bad input gets one line
naming the key, exit code 2, and nothing started. Only hydra and omegaconf are imported
here; ray, torch and mlflow load when a job runs, so --help stays fast.
"""

from __future__ import annotations

import itertools
import re
import sys

import hydra
from omegaconf import DictConfig

from rayflow.config import ConfigError, renamed_key_error
from rayflow.redaction import mask_text

CONFIG_MODULE = "rayflow.conf"
CONFIG_NAME = "config"
MAX_PREFLIGHT_JOBS = 256


def _sweep_points(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override lists of each job a (multi)run will launch; hydra.* overrides dropped."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for override in parsed:
        if override.get_key_element().lstrip("+~").startswith("hydra"):
            continue
        if multirun and override.is_sweep_override():
            key = override.get_key_element()
            axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            axes.append([override.input_line])
    return [list(point) for point in itertools.islice(itertools.product(*axes), MAX_PREFLIGHT_JOBS)]


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


def compose_config(*overrides: str) -> DictConfig:
    """The config `python -m rayflow OVERRIDES` composes (unresolved, unchecked): for notebooks,
    scripts and tests."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        return compose(CONFIG_NAME, overrides=list(overrides))


def preflight(overrides: list[str], multirun: bool) -> None:
    """Compose and check every job. Only configuration errors (rayflow's, Hydra's, OmegaConf's)
    become ConfigError; anything else is a bug in rayflow and keeps its traceback."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rayflow.session import check_config

    try:
        points = _sweep_points(overrides, multirun)
        with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
            for point in points:
                check_config(compose(CONFIG_NAME, overrides=point))
    except (HydraException, OmegaConfBaseException) as err:
        raise one_line(err) from None
    finally:
        GlobalHydra.instance().clear()


# Exit codes (README: "Exit codes"): 0 done, 1 the run failed, 2 bad input (nothing
# started), 128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
EXIT_FAILED, EXIT_BAD_INPUT = 1, 2


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> None:
    print(f"rayflow: error: {mask_text(str(err))}", file=sys.stderr)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _job(cfg: DictConfig):
    from rayflow.backends.base import ClusterError
    from rayflow.data import DataError
    from rayflow.remote import JobError
    from rayflow.session import RunFailed, RunInterrupted, run_job

    try:
        run_job(cfg)
    except ConfigError as err:
        fail(err)
    except (DataError, RunFailed, JobError, ClusterError) as err:
        fail(err, EXIT_FAILED)
    except RunInterrupted as stop:  # Ctrl-C: torn down, state saved
        print(f"rayflow: {stop}", file=sys.stderr)
        sys.exit(130)


def main() -> None:
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(sys.argv[1:])
    informational = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    if not informational:
        try:
            preflight(args.overrides, args.multirun)
        except ConfigError as err:
            fail(err)
    _job()


if __name__ == "__main__":
    main()
