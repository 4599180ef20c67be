"""The one door to Hydra's private modules (`hydra._internal`) and to the private attributes of its
public classes (JobReturn's): every use of them in rayflow/ goes through a function here
(tests/test_layout.py holds it so), so a Hydra upgrade is checked in one place. Each entry says
why no public Hydra API does the same. Nothing is imported before a function is called, and
nothing of rayflow at all."""

from __future__ import annotations

import argparse
from typing import Any


def args_parser() -> argparse.ArgumentParser:
    """The parser of @hydra.main's command line (hydra._internal.utils.get_args_parser: its
    flags, --cfg, --info, --multirun, the overrides): rayflow's CLI reads the line as Hydra would
    before deciding whether Hydra answers it (--help, --cfg, ...) or rayflow runs it. @hydra.main
    parses inside itself, and no public call returns the parser."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def hydra_class() -> Any:
    """Hydra's application class (hydra._internal.hydra.Hydra), whose compose_config the CLI
    swaps while Hydra answers --cfg, --help and --info, so that what it prints has its secrets
    masked: Hydra has no public hook between composing a config and printing it."""
    from hydra._internal.hydra import Hydra

    return Hydra


def sweep_batches(overrides: list[Any]) -> list[list[list[str]]]:
    """The parsed overrides of a multirun split into its jobs' override lists, as Hydra's
    BasicSweeper splits them (every combination, in its order; one batch:
    BasicSweeper.split_arguments, max_batch_size=None): the expansion of a sweep lives only in
    that private class, and no public function returns it."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(overrides, max_batch_size=None)


def job_return_value(job_return: Any) -> Any:
    """What a Hydra job returned, or the exception it raised, as it is (JobReturn._return_value):
    the launcher sends it home and prints its first line, where the public JobReturn.return_value
    raises a failed job's exception (and writes to stderr) instead of handing it over."""
    return job_return._return_value


__all__ = ["args_parser", "hydra_class", "job_return_value", "sweep_batches"]
