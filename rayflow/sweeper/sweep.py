"""One `sweep()` of `hydra/sweeper=rayflow`: every check before anything starts, then the search as
rayflow's own run (rayflow.orchestrator: the cluster, one Tune run, MLflow, the teardown) whose
trials are the app's Hydra jobs (rayflow.workloads.hydra_sweep), then the sweep dir's outputs
(rayflow.sweeper.outputs)."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, open_dict

from rayflow.api import CLI_HINT
from rayflow.errors import (
    ClusterError,
    ConfigError,
    DataError,
    JobError,
    RunFailed,
    RunInterrupted,
    Terminated,
)
from rayflow.security.printable import printable
from rayflow.security.redaction import mask_text
from rayflow.sweeper.params import Search, read_search
from rayflow.sweeper.settings import rayflow_config, read_settings, sweeper_key

log = logging.getLogger(__name__)


class SweeperError(CompactHydraException):
    """What the user can fix, as one line (Hydra prints it without a traceback)."""


@dataclass
class JobComposer:
    """A trial's Hydra job config, composed in the process that drives Tune (where the app's config
    files are) as Hydra's launchers compose a sweep's jobs: the sweep config with the trial's
    overrides."""

    hydra_context: Any
    config: DictConfig  # the multirun's config
    search: Search
    sweep_dir: str  # resolved once: `${now:...}` in it is this sweep's time, not each trial's
    shipped: Any = None  # rayflow.sweeper.shipping.ShippedConfigs, once the search is shipped
    bundle: str | None = None  # where the shipped bundle is, on the cluster's head (at())

    def at(self, bundle: Any) -> JobComposer:
        """This composer where the bundle it was shipped in is (a cluster's head): its config
        loader reads the app's config files copied into the bundle."""
        from hydra.types import HydraContext

        from rayflow.sweeper.shipping import loader_at

        loader = loader_at(self.hydra_context.config_loader, bundle, self.shipped)
        context = HydraContext(config_loader=loader, callbacks=self.hydra_context.callbacks)
        return dataclasses.replace(self, hydra_context=context, bundle=str(bundle))

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled on a head (Tune keeps the search algorithm, and so this composer, in the
        experiment's tuner.pkl), it is found again where a resumed search's own bundle is: the
        first job's bundle went with its cluster."""
        if self.bundle is None:
            return super().__reduce_ex__(protocol)
        from rayflow.workloads.hydra_sweep import shipped_composer

        return (shipped_composer, ())

    def __call__(self, trial_config: Any, num: int) -> str:
        from rayflow.workloads.hydra_sweep import packed_job

        job = self.hydra_context.config_loader.load_sweep_config(
            self.config, self.search.overrides(trial_config)
        )
        with open_dict(job):
            job.hydra.job.id = str(num)
            job.hydra.job.num = num
            job.hydra.sweep.dir = self.sweep_dir
        return packed_job(job)


def sweep(sweeper: Any, arguments: list[str]) -> None:
    from hydra.core.utils import configure_log, setup_globals

    setup_globals()
    configure_log(sweeper.config.hydra.hydra_logging, sweeper.config.hydra.verbose)
    try:
        _sweep(sweeper, arguments)
    except ConfigError as err:
        raise SweeperError(
            f"rayflow: error: {sweeper_key(err.key)}: {_text(str(err).split(': ', 1)[-1])}"
            if err.key and not err.key.startswith("hydra.")
            else f"rayflow: error: {_text(str(err))}"
        ) from None
    except RunInterrupted:
        _say("rayflow: interrupted; the search's state is saved in its sweep dir")
        _say(f"{RESUME} {_resume_hint(sweeper)}")
        raise SystemExit(130) from None
    except SystemExit as ended:
        # Ctrl-C while the search ran as a job on a cluster's head: the job was stopped
        # (rayflow.orchestrator.remote_run) and saved its state where the search keeps it
        if ended.code == 130 and not isinstance(ended, Terminated):
            _say(f"{RESUME} {_resume_hint(sweeper)}")
        raise
    except RunFailed as err:
        more = f" {RESUME} {_resume_hint(sweeper)}" if err.result is not None else ""
        raise SweeperError(f"rayflow: error: {_text(str(err))}{more}") from None
    except (ClusterError, DataError, JobError) as err:
        raise SweeperError(f"rayflow: error: {_text(str(err))}") from None


RESUME = "Continue the search with the same command and:"


def _text(message: str) -> str:
    """A message as printed here: masked, printable, without the resume hint of rayflow's own
    command line (a sweep continues with its own, RESUME)."""
    return printable(mask_text(message)).split(f" {CLI_HINT}")[0].rstrip(" .;")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _resume_hint(sweeper: Any) -> str:
    return f"hydra.sweep.dir={_sweep_dir(sweeper.config)} hydra.sweeper.resume=true"


def _sweep_dir(config: DictConfig) -> str:
    return os.path.abspath(str(config.hydra.sweep.dir))


def _tolerated(result: Any, own: dict) -> bool:
    """Whether the trials that failed are within max_failure_rate (the Optuna sweeper's rule):
    then the sweep ends as one that succeeded, its failures said and recorded."""
    summary = getattr(result, "summary", None)
    if summary is None or summary.interrupted or not summary.trials:
        return False
    return 0 < summary.errored / summary.trials <= float(own["max_failure_rate"])


def _sweep(sweeper: Any, arguments: list[str]) -> None:
    from hydra.core.singleton import Singleton

    from rayflow.workloads import user_code
    from rayflow.workloads.hydra_sweep import TrialSpec, trial_function

    config = sweeper.config
    settings = read_settings(sweeper.settings)
    search = read_search(settings.own["params"], list(arguments))
    sweep_dir = _sweep_dir(config)
    spec = TrialSpec(
        sweeper.hydra_context,
        sweeper.task_function,
        Singleton.get_state(),
        False,  # known once the backend is
        os.getcwd(),
        str(settings.own["metric"]),
        JobComposer(sweeper.hydra_context, config, search, sweep_dir),
    )
    name = user_code.give(trial_function(spec))
    try:
        composed = rayflow_config(settings, search, name, sweep_dir, str(config.hydra.job.name))
        with tempfile.TemporaryDirectory(prefix="rayflow-sweep-") as staging:
            plan = _plan(composed, spec, staging)
            os.makedirs(sweep_dir, exist_ok=True)
            log.info(
                f"rayflow sweeper: {settings.own['n_trials']} trials of {len(search.space)} "
                f"parameter(s) on backend={settings.own['backend']}, sweep dir {sweep_dir}"
            )
            _search(plan, settings.own, search, sweep_dir, spec.in_place)
    finally:
        user_code.forget(name)


def _plan(search: Any, spec: Any, staging: str) -> Any:
    """Every check of the search's run (rayflow's preflight), starting nothing. On a backend that
    submits the run (vm, kuberay), the search's driver is a Ray Job on the head: the trials'
    spec and the app's config files go with it, in a bundle staged in `staging`."""
    from rayflow.orchestrator.compose import config_errors
    from rayflow.orchestrator.preflight import check_backend, plan_job
    from rayflow.sweeper.shipping import ship_search

    backend = config_errors(lambda: check_backend(search.cfg))
    spec.in_place = not backend.traits.submits_jobs and backend.traits.shares_filesystem
    if not backend.traits.submits_jobs:
        return config_errors(lambda: plan_job(search.cfg, search.overrides))
    package = ship_search(search, spec, staging)
    plan = config_errors(lambda: plan_job(search.cfg, search.overrides))
    return dataclasses.replace(plan, shipped=(package,))


def _search(plan: Any, own: dict, search: Search, sweep_dir: str, in_place: bool) -> None:
    """The search as rayflow's run, then the sweep dir's outputs, also of a failed or interrupted
    one; failed trials within max_failure_rate end it as a success."""
    from rayflow.orchestrator.session import run_jobs
    from rayflow.runtime.run_log import quiet_libraries
    from rayflow.runtime.verbosity import level
    from rayflow.sweeper.outputs import write_outputs

    result = None
    # Ray's and MLflow's INFO records off the app's terminal, as in a run of rayflow's own
    quiet = quiet_libraries(level(plan.cfg.get("verbose")), ("ray", "mlflow"))
    try:
        with quiet:
            [result] = run_jobs([plan])
    except (RunFailed, RunInterrupted) as err:
        result = getattr(err, "result", None)
        if not (isinstance(err, RunFailed) and _tolerated(result, own)):
            raise
        _say(f"rayflow: {_text(str(err))} (within max_failure_rate)")
    finally:
        if result is not None:
            write_outputs(
                result,
                search,
                sweep_dir,
                in_place,
                str(own["metric"]),
                minimize=own["direction"] == "minimize",
            )
