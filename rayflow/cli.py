"""`python -m rayflow` / `rayflow`: Hydra's command line, a preflight, then the jobs.

The preflight (rayflow.composition) composes the config of every job the command line asks for
(each point of a `-m` sweep) and runs every check before any job starts, so bad input gets one
line naming the key, exit code 2, and nothing started. The jobs then run in order through
session.run_jobs, which starts each cluster once for the consecutive jobs that share it.
Hydra's own `@hydra.main` answers the informational flags (--help, --cfg, --info, shell
completion). Only hydra and omegaconf are imported here; ray, torch and mlflow load when a
job runs, so --help stays fast.
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from rayflow.composition import CONFIG_MODULE, CONFIG_NAME, preflight
from rayflow.errors import (
    ClusterError,
    ConfigError,
    DataError,
    JobError,
    RunFailed,
    RunInterrupted,
)
from rayflow.redaction import mask_text

# Exit codes (docs: "Exit codes"): 0 done, 1 the run failed, 2 bad input (nothing
# started), 128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> None:
    print(f"rayflow: error: {mask_text(str(err))}", file=sys.stderr)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _informational(cfg: DictConfig) -> None:
    """Hydra's entry point, used for --help, --hydra-help, --cfg, --info and shell completion,
    which Hydra answers without calling this function."""


def _log_like_hydra() -> None:
    # What @hydra.main's default job logging did for a run: INFO and above on the console.
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")


def main() -> None:
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(sys.argv[1:])
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        _informational()
        return
    try:
        jobs = preflight(args.overrides, args.multirun)
    except ConfigError as err:
        fail(err)
    _log_like_hydra()
    from rayflow.session import run_jobs

    try:
        run_jobs(jobs)
    except ConfigError as err:
        fail(err)
    except (DataError, RunFailed, JobError, ClusterError) as err:
        fail(err, EXIT_FAILED)
    except RunInterrupted as stop:  # Ctrl-C: torn down, state saved
        print(f"rayflow: {stop}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
