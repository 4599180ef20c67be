"""Hydra jobs as Ray tasks: one job on whichever node Ray places it (`run_on_node`), and the loop
that runs a batch of them at once with the resources each asks for (`run_batch`). The loop runs in
the process connected to the cluster: the launching one (local, attach, spark), or a Ray Job on the
head (vm, kuberay: rayflow.launcher.on_head)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, open_dict, read_write

from rayflow.errors import RunFailed
from rayflow.launcher.outputs import pack
from rayflow.runtime import hydra_internals
from rayflow.runtime.placement import PlacementWatch


@dataclass
class Shared:
    """What every job of a launch shares, shipped once: Hydra's context and state (OmegaConf
    resolvers the app registered included), the task function, and where the jobs write."""

    hydra_context: Any
    task_function: Callable
    singleton_state: dict
    in_place: bool  # the nodes share this machine's files: a job writes its own sweep subdir
    cwd: str  # the launching process's working directory (relative sweep dirs are under it)


@dataclass
class HydraJob:
    idx: int  # hydra.job.num
    overrides: list[str]
    config: DictConfig  # the job's sweep config (hydra.job.id and num set)
    resources: dict  # Ray resources: CPU, GPU, memory, custom names
    what: str  # "job #3 (lr=0.1)", for messages
    keys: dict = field(default_factory=dict)  # Ray resource -> the config key that set it


@dataclass
class Finished:
    """A job's end as its node saw it: Hydra's JobReturn (None where it never ran), the output
    folder packed (None where it ran in place), and what went wrong outside the task function."""

    idx: int
    job_return: Any = None
    files: bytes | None = None
    node_output_dir: str | None = None
    left_out: list[str] = field(default_factory=list)
    error: str | None = None
    in_output_dir: bool = False  # the task ran in its output folder (hydra.job.chdir)
    # what it wrote in its working directory outside the output folder
    cwd_files: bytes | None = None


def run_on_node(shared: Shared, job: HydraJob) -> Finished:
    """One Hydra job, as Hydra's own launchers run it (`run_job`), in a Ray worker: in the launching
    directory where the nodes share it, else in a scratch folder whose outputs go back packed."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals

    setup_globals()
    # resolvers, JobRuntime, HydraConfig of the launcher
    Singleton.set_state(shared.singleton_state)
    config = job.config
    before, scratch = os.getcwd(), None
    if shared.in_place:
        os.chdir(shared.cwd)
    else:
        scratch = tempfile.mkdtemp(prefix="rayflow-hydra-job-")
        os.chdir(scratch)
        sweep_dir = str(config.hydra.sweep.dir)
        if os.path.isabs(sweep_dir):  # this machine's path: kept under the scratch folder
            with read_write(config.hydra.sweep), open_dict(config.hydra.sweep):
                config.hydra.sweep.dir = os.path.join(scratch, sweep_dir.lstrip(os.sep))
    try:
        job_return = run_job(
            hydra_context=shared.hydra_context,
            task_function=shared.task_function,
            config=config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        if shared.in_place:
            return Finished(job.idx, job_return)
        output_dir = str(config.hydra.runtime.output_dir)
        files, left_out = pack(output_dir)
        # the task moved into its output folder, away from its cwd (the scratch folder)
        moved = os.path.realpath(job_return.working_dir or ".") == os.path.realpath(output_dir)
        # with hydra.job.chdir=false the scratch folder stands for the launching directory
        assert scratch is not None  # made above for a job that does not run in place
        cwd_files, more = pack(scratch, skip=output_dir)
        return Finished(
            job.idx,
            job_return,
            files,
            output_dir,
            left_out + more,
            in_output_dir=moved,
            cwd_files=cwd_files,
        )
    finally:
        os.chdir(before)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def job_failed(finished: Finished) -> str | None:
    """The failure's one line, or None for a job that completed."""
    from hydra.core.utils import JobStatus

    if finished.error:
        return finished.error
    if finished.job_return is not None and finished.job_return.status == JobStatus.FAILED:
        return _first_line(hydra_internals.job_return_value(finished.job_return))
    return None


def _options(job: HydraJob) -> dict[str, Any]:
    """The Ray task options of a job: the resources it asks for, named ones beside CPU, GPU and
    memory."""
    custom = {k: v for k, v in job.resources.items() if k not in ("CPU", "GPU", "memory")}
    return {
        "num_cpus": job.resources.get("CPU", 0),
        "num_gpus": job.resources.get("GPU", 0),
        "memory": job.resources.get("memory"),
        "resources": custom,
        "name": f"hydra job #{job.idx}",
    }


def _finished(ref: Any, job: HydraJob) -> Finished:
    """The end of `job`'s task: its Finished, or the error of a task whose result never came."""
    import ray

    try:
        finished: Finished = ray.get(ref)
    except ray.exceptions.RayError as err:  # the worker died, the result did not travel
        finished = Finished(job.idx, error=_first_line(getattr(err, "cause", None) or err))
    return finished


def run_batch(
    shared: Shared,
    jobs: list[HydraJob],
    max_concurrent: int | None,
    on_failure: str,
    schedule_timeout_s: float,
    say: Callable[[str], None],
) -> list[Finished]:
    """Every job as a Ray task with its resources, at most `max_concurrent` at once, in order.
    A failing job ends as its own Finished; with on_failure=stop the jobs not started yet are not
    started. A job no node can hold for `schedule_timeout_s` fails the batch (RunFailed)."""
    import ray

    task = ray.remote(max_retries=0)(run_on_node)  # a job's side effects are not repeated
    shared_ref = ray.put(shared)
    queue = list(jobs)
    running: dict[Any, HydraJob] = {}  # a task's ObjectRef -> its job
    done: dict[int, Finished] = {}
    stopped_by: HydraJob | None = None
    hint = "lower the job's resources or use a cluster with bigger nodes"
    with PlacementWatch(schedule_timeout_s, hint) as watch:
        try:
            while queue or running:
                while (
                    queue
                    and stopped_by is None
                    and (max_concurrent is None or len(running) < max_concurrent)
                ):
                    job = queue.pop(0)
                    running[task.options(**_options(job)).remote(shared_ref, job)] = job
                if not running:
                    break
                ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in ready:
                    job = running.pop(ref)
                    finished = _finished(ref, job)
                    done[job.idx] = finished
                    failure = job_failed(finished)
                    if failure:
                        say(f"[rayflow] {job.what} failed: {failure}")
                        if on_failure == "stop" and stopped_by is None:
                            stopped_by = job
        except KeyboardInterrupt:
            for ref in running:
                ray.cancel(ref, force=True)
            if watch.message is not None:
                raise RunFailed(watch.message) from None
            raise
    for job in queue:
        done[job.idx] = Finished(
            job.idx,
            error=f"not started: {stopped_by.what if stopped_by else 'an earlier job'} "
            "failed and hydra.launcher.on_failure=stop",
        )
    return [done[job.idx] for job in jobs]


def ship_app_modules(app_dir: str) -> None:
    """The app's own modules (files under its folder, outside any installed package) travel by
    value with the task function, as `__main__` does: nodes that do not share this machine's files
    cannot import them."""
    import cloudpickle

    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    root = os.path.realpath(app_dir) + os.sep
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        path = os.path.realpath(file) if file else None
        if (
            path
            and path.startswith(root)
            and "site-packages" not in path
            and "." not in name
            and name not in ("__main__", "rayflow", "hydra_plugins")
            and not any(path.startswith(p + os.sep) for p in installed)
        ):
            cloudpickle.register_pickle_by_value(module)
