"""The Tune run of `hydra/sweeper=rayflow` (rayflow.sweeper): workload=tune whose trainable runs one
Hydra job per trial, as Hydra's own launchers run it (`run_job`), with `rayflow.report` bound to
`tune.report` while the task function runs, and its return value as the trial's final result.

A trial's job config is composed where the app's config files are, in the process that drives
Tune: the search algorithm's wrapper composes it from the trial's sampled values as the trial is
made, and the trial carries it (packed, under JOB_KEY, kept out of MLflow's params and the
results table). Where the nodes do not share this machine's files, the job writes under its
trial's own folder, copied to its folder of the experiment's storage when the job ends
(rayflow.sweeper.outputs brings it home).
"""

from __future__ import annotations

import base64
import json
import math
import os
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray.tune.search import SearchAlgorithm

from rayflow.results.records import RAN_TO_END
from rayflow.runtime.report import reporting_to
from rayflow.workloads import tune

KIND = "tune"
RESUME = "the same command, its hydra.sweep.dir and hydra.sweeper.resume=true"
JOB_KEY = "_hydra_job"  # the composed job config a trial carries (packed_job)
JOB_NUM = "_hydra_job_num"  # and its hydra.job.num, as plain data (what the sweep dir reads)
COUNTER = "rayflow-hydra-jobs.json"  # beside the search's state: the jobs numbered so far
JOB_FOLDER = "job"  # under a trial's folder: the job's sweep dir, and its working dir

SHIPPED = "rayflow.workloads.hydra_sweep:shipped"  # the trainable's name for a driver on a head
PACKAGE = "rayflow_hydra_sweep"  # what the search ships with its job (rayflow.sweeper.shipping)
BUNDLE = "spec.pkl"  # in PACKAGE: the pickled TrialSpec

prepare = tune.prepare
worker_imports = tune.worker_imports
metrics = tune.metrics
check = tune.check
demand = tune.demand


@dataclass
class TrialSpec:
    """What every trial of a sweep shares, pickled with the trial function."""

    hydra_context: Any
    task_function: Callable
    singleton_state: dict  # Hydra's state (the app's OmegaConf resolvers included)
    in_place: bool  # the nodes share this machine's files: a job writes into the sweep dir
    cwd: str  # the launching directory (relative sweep dirs are under it)
    metric: str
    compose: Callable[[Mapping, int], str]  # (trial config, job number) -> packed_job


def trainable(cfg):
    """The trial function: the one this process registered, or, where the search's driver is a Ray
    Job on the cluster's head, the one the bundle it was shipped holds."""
    fn = tune.trainable(cfg)
    return trial_function(shipped_spec()) if fn is shipped else fn


def shipped(config: dict) -> None:
    """The trainable the config names for a search whose driver runs on a cluster's head:
    `trainable(cfg)` there replaces it with the shipped trial function."""
    raise RuntimeError("hydra_sweep.shipped stands for the shipped trial function; never called")


def bundle_folder() -> Path:
    """The shipped package's folder, as Ray installed it for the job (one of its py_modules)."""
    import importlib

    return Path(list(importlib.import_module(PACKAGE).__path__)[0])


def shipped_spec() -> TrialSpec:
    """The TrialSpec the launching process pickled into the bundle (this process is the job it
    submitted), its composer pointed at the app's config files shipped beside it."""
    from hydra.core.singleton import Singleton

    folder = bundle_folder()
    spec = pickle.loads((folder / BUNDLE).read_bytes())  # written by the sweep that submitted us
    Singleton.set_state(spec.singleton_state)  # the app's ConfigStore and resolvers, to compose
    spec.compose = spec.compose.at(folder)
    return spec


def shipped_composer() -> Any:
    """The job composer of the search this process drives, from the bundle it was shipped (what
    a shipped composer unpickles to: rayflow.sweeper.sweep.JobComposer.__reduce__)."""
    return shipped_spec().compose


def params(cfg) -> tuple[str, ...]:
    """The searched keys (not the composed job a trial carries)."""
    return tuple(cfg.workload.search_space or ())


def figures(cfg, experiment_dir: Path) -> list:
    """The tune workload's plots, of the searched keys (not the job a trial carries)."""
    return tune.figures(cfg, experiment_dir, params(cfg))


def run(cfg, ctx):
    fn = trainable(cfg)
    spec: TrialSpec = fn.spec
    job = tune.job(cfg, fn)
    job.search_alg = composing(job.search_alg, spec.compose)
    summary = tune.run_job(job, ctx, params=params(cfg))
    summary.best_config.pop(JOB_KEY, None)
    summary.best_config.pop(JOB_NUM, None)
    return summary


def trial_function(spec: TrialSpec) -> Callable[[dict], None]:
    """The function trainable of a sweep: one Hydra job per trial."""

    def hydra_trial(config: dict) -> None:
        run_trial(spec, config)

    hydra_trial.spec = spec  # type: ignore[attr-defined]  # read back by run() in the driver
    return hydra_trial


class ComposingSearch(SearchAlgorithm):
    """The search algorithm, with each new trial's job config composed in the driver, where the
    app's config files are, before the trial starts (Tune's callbacks see a trial only once its
    process holds its config). Everything else is the wrapped algorithm's."""

    def __init__(self, inner: SearchAlgorithm, compose: Callable[[Mapping, int], str]):
        super().__init__()
        self.inner = inner
        self.compose = compose
        self.jobs = 0  # hydra.job.num of the next trial, in the order Tune makes them

    def next_trial(self):
        trial = self.inner.next_trial()
        if trial is not None and JOB_KEY not in trial.config:
            num, self.jobs = self.jobs, self.jobs + 1
            text = self.compose(trial.config, num)
            trial.set_config({**trial.config, JOB_KEY: text, JOB_NUM: num})
        return trial

    @property
    def metric(self):
        return self.inner.metric

    @property
    def total_samples(self):
        return self.inner.total_samples

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def add_configurations(self, experiments) -> None:
        self.inner.add_configurations(experiments)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def is_finished(self) -> bool:
        return self.inner.is_finished()

    def set_finished(self) -> None:
        self.inner.set_finished()

    def has_checkpoint(self, dirpath: str) -> bool:
        return self.inner.has_checkpoint(dirpath)

    def save_to_dir(self, dirpath: str, **kwargs) -> None:
        self.inner.save_to_dir(dirpath, **kwargs)
        Path(dirpath, COUNTER).write_text(json.dumps({"jobs": self.jobs}))

    def restore_from_dir(self, dirpath: str) -> None:
        """A resumed search numbers its new jobs after those it made before."""
        self.inner.restore_from_dir(dirpath)
        saved = Path(dirpath, COUNTER)
        if saved.is_file():
            self.jobs = int(json.loads(saved.read_text()).get("jobs", 0))


def composing(search_alg: Any, compose: Callable[[Mapping, int], str]) -> ComposingSearch:
    """The run's search algorithm (rayflow.workloads.tune_search: None for plain random search, a
    BasicVariantGenerator, or a Searcher) as Tune would wrap it, composing each trial's job."""
    from ray.tune.search import BasicVariantGenerator, Searcher, SearchGenerator

    if search_alg is None:
        search_alg = BasicVariantGenerator()
    elif isinstance(search_alg, Searcher):
        search_alg = SearchGenerator(search_alg)
    return ComposingSearch(search_alg, compose)


def packed_job(config: Any) -> str:
    """A composed job config as a trial carries it: pickled whole (Hydra's structured `hydra` node
    and the flags its loader set travel with it), as text. It goes from the driver to the trial,
    never back."""
    import cloudpickle  # Hydra reloads its plugins' modules: their classes travel by value

    return base64.b64encode(cloudpickle.dumps(config)).decode("ascii")


def _job_config(text: str):
    return pickle.loads(base64.b64decode(text))  # written by this sweep's driver (packed_job)


def run_trial(spec: TrialSpec, config: dict) -> None:
    """One Hydra job in a Tune trial; raises the task's own exception when it fails."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import run_job, setup_globals
    from omegaconf import open_dict, read_write
    from ray import tune as ray_tune

    job = _job_config(config[JOB_KEY])
    cwd = spec.cwd
    if not spec.in_place:  # the job and its working dir under the trial's folder, copied home
        cwd = str(Path(ray_tune.get_context().get_trial_dir(), JOB_FOLDER))
        with read_write(job.hydra.sweep), open_dict(job.hydra.sweep):
            job.hydra.sweep.dir = cwd
    os.makedirs(cwd, exist_ok=True)
    setup_globals()
    Singleton.set_state(spec.singleton_state)
    reported: list[dict] = []  # the task's last rayflow.report, for a task that returns None

    def report(metrics: dict) -> None:
        reported[:] = [metrics]
        ray_tune.report(metrics)

    before = os.getcwd()
    os.chdir(cwd)
    try:
        with reporting_to(report):
            ret = run_job(
                hydra_context=spec.hydra_context,
                task_function=spec.task_function,
                config=job,
                job_dir_key="hydra.sweep.dir",
                job_subdir_key="hydra.sweep.subdir",
            )
    finally:
        os.chdir(before)
        if not spec.in_place:
            _store_job_folder(cwd)
    # a failed job's return_value raises the task's own exception, with its traceback
    final = final_result(ret.return_value, spec.metric) or (reported[-1] if reported else {})
    if final:  # a trial a scheduler stopped has no such result
        ray_tune.report({**final, RAN_TO_END: True})


def _store_job_folder(folder: str) -> None:
    """The job's folder into its trial's folder of the experiment's storage, whole, now: Tune's
    own background sync of a trial's files was seen to leave a finished trial's out on an object
    store (the first trial of a search on kuberay)."""
    import pyarrow.fs
    from ray import tune as ray_tune

    storage = ray_tune.get_context().get_storage()
    pyarrow.fs.copy_files(
        folder,
        f"{storage.trial_fs_path}/{JOB_FOLDER}",
        destination_filesystem=storage.storage_filesystem,
    )


def _number(value: Any) -> float | None:
    if hasattr(value, "item") and callable(value.item):  # numpy and torch scalars
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def final_result(value: Any, metric: str) -> dict:
    """The trial's last result from the task's return value: a number reported as `metric`, or a
    dict's numbers (holding `metric`); empty when the task returned None (it reported through
    rayflow.report alone, or not at all)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        numbers = {str(k): n for k, v in value.items() if (n := _number(v)) is not None}
        if metric not in numbers:
            raise ValueError(
                f"the task function returned a dict without a number under {metric!r} "
                f"(hydra.sweeper.metric); it holds: {', '.join(map(str, value)) or 'nothing'}"
            )
        return numbers
    number = _number(value)
    if number is None:
        raise TypeError(
            f"the task function returned {type(value).__name__} {value!r:.80}; return a number "
            f"or a dict holding {metric!r} (hydra.sweeper.metric)"
        )
    return {metric: number}
