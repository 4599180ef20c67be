"""One `launch()` of `hydra/launcher=rayflow`: every check before anything starts, then the cluster
(rayflow.orchestrator.cluster.cluster_scope, the lifecycle of rayflow's own runs), the jobs as Ray
tasks, their outputs under the local sweep dir, and Hydra's JobReturns, in the order of the jobs."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from rayflow.errors import ClusterError, ConfigError, DataError, JobError, RunFailed
from rayflow.launcher.jobs import Finished, HydraJob, Shared, run_batch, ship_app_modules
from rayflow.launcher.outputs import SYNC_LIMIT, unpack
from rayflow.launcher.settings import (
    check_backend,
    check_fits_each,
    job_resources,
    rayflow_config,
    read_settings,
)
from rayflow.runtime.run_log import quiet_libraries
from rayflow.runtime.verbosity import level
from rayflow.security.printable import printable
from rayflow.security.redaction import mask_text

log = logging.getLogger(__name__)

# Where a job's files written outside its output folder (hydra.job.chdir=false) come back: inside
# it.
CWD_FOLDER = "cwd"


class LauncherError(CompactHydraException):
    """What the user can fix, as one line (Hydra prints a CompactHydraException without a
    traceback)."""


class _KeptClusters:
    """The clusters kept running between launches inside `keep_clusters()`: cluster key -> (its
    scope, the cluster); None outside the block. Process-wide: Hydra makes a new launcher for each
    launch and hands it nothing of the last one, so what outlives a launch is the block's, the
    process's; its one instance is `_KEPT`."""

    def __init__(self) -> None:
        self.clusters: dict[str, tuple[contextlib.ExitStack, Any]] | None = None

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        if self.clusters is not None:  # nested: the outer block stops them
            yield
            return
        self.clusters = {}
        try:
            yield
        finally:
            kept, self.clusters = self.clusters, None
            for stack, _ in reversed(list(kept.values())):
                stack.close()

    @contextlib.contextmanager
    def cluster(self, cfg: DictConfig, backend: Any) -> Iterator[Any]:
        from rayflow.orchestrator.cluster import cluster_key, cluster_scope

        kept = self.clusters
        if kept is None:
            with cluster_scope(backend) as cluster:
                yield cluster
            return
        key = cluster_key(cfg)
        if key not in kept:
            stack = contextlib.ExitStack()
            kept[key] = (stack, stack.enter_context(cluster_scope(backend)))
        try:
            yield kept[key][1]
        except BaseException:  # a cluster that failed a launch is not handed to the next one
            kept.pop(key)[0].close()
            raise


_KEPT = _KeptClusters()


def keep_clusters() -> contextlib.AbstractContextManager[None]:
    return _KEPT.keeping()


def _cluster(cfg: DictConfig, backend: Any) -> contextlib.AbstractContextManager[Any]:
    return _KEPT.cluster(cfg, backend)


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    from hydra.core.utils import configure_log, setup_globals

    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    try:
        return _launch(launcher, job_overrides, initial_job_idx)
    except (ConfigError, ClusterError, DataError, JobError, RunFailed) as err:
        raise LauncherError(f"rayflow: error: {printable(mask_text(str(err)))}") from None


def _launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
    from hydra.core.singleton import Singleton
    from hydra.core.utils import filter_overrides

    settings = read_settings(launcher.settings)
    cwd = os.getcwd()
    jobs = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        config = launcher.hydra_context.config_loader.load_sweep_config(
            launcher.config, list(overrides)
        )
        with open_dict(config):
            config.hydra.job.id = idx  # as Hydra's basic launcher: no scheduler hands out ids
            config.hydra.job.num = idx
        what = f"job #{idx} ({' '.join(filter_overrides(overrides)) or 'no overrides'})"
        resources, keys = job_resources(settings, config, what)
        jobs.append(HydraJob(idx, list(overrides), config, resources, what, keys))
    cfg = rayflow_config(settings, gpu=any(job.resources.get("GPU") for job in jobs))
    backend = check_backend(cfg)
    check_fits_each(backend, jobs)
    local_dirs = {job.idx: _local_output_dir(job.config, cwd) for job in jobs}

    Path(str(launcher.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    log.info(f"Launching {len(jobs)} jobs on backend={settings.backend}")
    for job in jobs:
        log.info(f"\t#{job.idx} : {' '.join(filter_overrides(job.overrides))}")
    # Ray's and MLflow's INFO records (Ray's start, its connect) off the app's terminal, as a
    # run's (rayflow.runtime.run_log); the jobs' own output is the app's
    quiet = quiet_libraries(level(cfg.get("verbose")), ("ray",))
    with quiet, _cluster(cfg, backend) as cluster:
        handle, _ = cluster.acquire()
        in_place = not backend.traits.submits_jobs and backend.traits.shares_filesystem
        shared = Shared(
            launcher.hydra_context, launcher.task_function, Singleton.get_state(), in_place, cwd
        )
        if not in_place:
            ship_app_modules(
                os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else cwd
            )
        if backend.traits.submits_jobs:
            from rayflow.launcher.submit import submit_batch

            finished = submit_batch(handle, shared, jobs, settings)
        else:
            finished = run_batch(
                shared,
                jobs,
                settings.max_concurrent,
                settings.on_failure,
                settings.schedule_timeout_s,
                say=_say,
            )
        # outputs land here before the cluster goes (nothing is left to fetch from it afterwards)
        return [
            _job_return(job, done, local_dirs[job.idx], cwd)
            for job, done in zip(jobs, finished, strict=True)  # one Finished per job, in order
        ]


def _say(line: str) -> None:
    # a job's error may quote a secret, and a node's words are data: masked, then printable
    print(printable(mask_text(line)), file=sys.stderr, flush=True)


def _local_output_dir(config: DictConfig, cwd: str) -> str:
    """Where Hydra puts the job's outputs, as this machine resolves it (sweep dir / subdir)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_config = HydraConfig.instance()
    previous = hydra_config.cfg
    hydra_config.set_config(config)  # ${hydra:...} in the subdir resolves against this job
    try:
        folder = os.path.join(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir))
    finally:
        hydra_config.cfg = previous
    return os.path.normpath(os.path.join(cwd, folder))


def _job_return(job: HydraJob, done: Finished, local_dir: str, cwd: str):
    """Hydra's JobReturn for the launching process: the node's, with its outputs unpacked under
    `local_dir` and its paths made this machine's; for a job that never ran, a FAILED one."""
    from hydra.core.utils import JobReturn, JobStatus

    ret = done.job_return
    if ret is None:  # never started, or its worker died: the failure is its return value
        config = copy.deepcopy(job.config)
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        overrides = OmegaConf.to_container(config.hydra.overrides.task)
        assert isinstance(overrides, list)  # the container of a ListConfig
        ret = JobReturn(
            overrides=overrides,
            cfg=task_cfg,
            hydra_cfg=OmegaConf.create({"hydra": OmegaConf.to_container(config.hydra)}),
            working_dir=local_dir,
            task_name=str(config.hydra.job.name),
            status=JobStatus.FAILED,
        )
        ret.return_value = RuntimeError(printable(mask_text(f"{job.what}: {done.error}")))
        return ret
    if done.files is None:  # ran in place: its outputs are where Hydra put them
        return ret
    unpack(done.files, local_dir)
    # written in its working directory (hydra.job.chdir=false): under its own folder, never into
    # this process's directory, where a node's files could replace the user's
    if done.cwd_files and unpack(done.cwd_files, os.path.join(local_dir, CWD_FOLDER)):
        _say(
            f"[rayflow] {job.what}: what it wrote in its working directory is in "
            f"{os.path.join(local_dir, CWD_FOLDER)}"
        )
    for item in done.left_out:
        _say(
            f"[rayflow] {job.what}: left on the node, over the {SYNC_LIMIT // 2**20} MiB a job "
            f"brings back: {item}"
        )
    hydra = ret.hydra_cfg.hydra  # this machine's paths (Hydra marks these nodes read-only)
    with read_write(hydra.runtime), open_dict(hydra.runtime):
        hydra.runtime.output_dir = local_dir
    with read_write(hydra.sweep), open_dict(hydra.sweep):
        hydra.sweep.dir = str(job.config.hydra.sweep.dir)
    ret.working_dir = local_dir if done.in_output_dir else cwd
    return ret
