"""`python -m rayflow` / `rayflow`: Hydra's command line, a preflight, then the jobs.

The preflight (rayflow.orchestrator.preflight) composes the config of every job the command line
asks for (each point of a `-m` sweep) and runs every check before any job starts, so bad input gets
one line naming the key, exit code 2, and nothing started. The jobs then run in order through
rayflow.orchestrator.session.run_jobs, which starts each cluster once for the consecutive jobs that
share it. Hydra's own `@hydra.main` answers the informational flags (--help, --cfg, --info, shell
completion). Only hydra and omegaconf are imported here; ray, torch and mlflow load when a job runs,
so --help stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from rayflow.errors import (
    ClusterError,
    ConfigError,
    DataError,
    JobError,
    RunFailed,
    RunInterrupted,
)
from rayflow.orchestrator.compose import CONFIG_MODULE, CONFIG_NAME, plugin_options
from rayflow.runtime import hydra_internals
from rayflow.security.printable import printable
from rayflow.security.redaction import mask_text, masked_message, redact

if TYPE_CHECKING:
    from rayflow.orchestrator.submission import OnHead

# Exit codes (docs: "Exit codes"): 0 done, 1 the run failed, 2 bad input (nothing
# started), 128 + N stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> None:
    # an error may quote what a cluster, a log or a store said: masked, then printable
    print(f"rayflow: error: {printable(masked_message(err))}", file=sys.stderr)
    sys.exit(code)


class MaskedStream:
    """A text stream that masks secrets in what is written to it, write by write (so nothing is
    held back): stderr for the whole command (errors, warnings, a bug's traceback), stdout for
    what Hydra and argparse print. A run's stdout is left alone: a dry run prints the very
    document the engine takes, already redacted structurally."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(mask_text(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def masked(name: str):
    """sys.stdout or sys.stderr replaced by a MaskedStream while the block runs."""
    stream = getattr(sys, name)
    setattr(sys, name, MaskedStream(stream))
    try:
        yield
    finally:
        setattr(sys, name, stream)


def redact_in_place(node, plain, masked) -> None:
    """Write into an OmegaConf node the leaves that `redact` changed (plain: the node as a
    container, unresolved; masked: its redacted copy). In place, so Hydra's own structure, flags
    and interpolations stay: `--resolve` then resolves against the masked values."""
    from omegaconf import flag_override

    keys = plain.keys() if isinstance(plain, dict) else range(len(plain))
    with flag_override(node, ["struct", "readonly"], [False, False]):
        for key in keys:
            if plain[key] == masked[key]:
                continue
            if isinstance(plain[key], (dict, list)) and type(masked[key]) is type(plain[key]):
                redact_in_place(node._get_node(key), plain[key], masked[key])
            else:
                node[key] = masked[key]


@contextlib.contextmanager
def hydra_shows_redacted():
    """Hydra's --cfg, --help and --info print the composed config (and --cfg hydra the override
    strings): each config Hydra composes here has its secrets masked before it is printed."""
    from unittest import mock

    from omegaconf import OmegaConf

    hydra_app = hydra_internals.hydra_class()
    compose = hydra_app.compose_config

    def redacted(self, *args, **kwargs):
        cfg = compose(self, *args, **kwargs)
        plain = OmegaConf.to_container(cfg, resolve=False)
        redact_in_place(cfg, plain, redact(plain))
        return cfg

    # Hydra has no hook between composing and printing: its method is swapped while the block runs
    with mock.patch.object(hydra_app, "compose_config", redacted):
        yield


@hydra.main(version_base="1.3", config_path="pkg://" + CONFIG_MODULE, config_name=CONFIG_NAME)
def _informational(cfg: DictConfig) -> None:
    """Hydra's entry point, used for --help, --hydra-help, --cfg, --info and shell completion,
    which Hydra answers without calling this function."""


def _log_like_hydra() -> None:
    # What @hydra.main's default job logging did for a run: INFO and above on the console.
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )


def main(on_head: OnHead | None = None) -> None:
    """`python -m rayflow`; `on_head`: this process is a submitted run's job on its cluster's head
    (rayflow.job_entry)."""
    sys.excepthook = masked_traceback  # printed after main() returns, past masked("stderr")
    with masked("stderr"):
        _main(on_head)


def masked_traceback(kind, value, tb) -> None:
    """A bug's traceback (or Hydra's, with HYDRA_FULL_ERROR=1) with the secrets it quotes masked."""
    import traceback

    sys.stderr.write(mask_text("".join(traceback.format_exception(kind, value, tb))))


def _main(on_head: OnHead | None) -> None:
    from rayflow.commands import COMMANDS

    if sys.argv[1:2] and sys.argv[1] in COMMANDS:  # a word, never an override (key=value)
        from rayflow.commands import main as command

        command(sys.argv[1:])
        return

    with masked("stdout"):  # argparse's usage error quotes the arguments
        args = hydra_internals.args_parser().parse_args(sys.argv[1:])
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        try:  # a backend plugin's option, for Hydra to compose (`--help`: every plugin's, listed)
            plugin_options(args.overrides, every=bool(args.help))
        except ConfigError as err:
            fail(err)
        with masked("stdout"), hydra_shows_redacted():
            _informational()
        return
    from rayflow.orchestrator.preflight import preflight

    try:
        jobs = preflight(args.overrides, args.multirun, on_head)
    except ConfigError as err:
        fail(err)
    _log_like_hydra()
    from rayflow.orchestrator.session import run_jobs

    try:
        run_jobs(jobs)
    except ConfigError as err:
        fail(err)
    except (DataError, RunFailed, JobError, ClusterError) as err:
        fail(err, EXIT_FAILED)
    except RunInterrupted as stop:  # Ctrl-C: torn down, state saved
        print(f"rayflow: {printable(str(stop))}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
