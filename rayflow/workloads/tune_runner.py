"""The one Ray Tune path: every workload that tunes, and scripts/bench.py, go through run_tune.

It adds what rayflow needs around a plain Tuner and nothing per result: experiment
folders that `resume=true` can find, Tuner.restore for them, actor reuse (a reused
trial process keeps its loaded data set). What goes around Tuner.fit() (callbacks, the
process's state while it runs, the interrupt) is rayflow.workloads.tune_fit; the end-of-run
summary is rayflow.workloads.tune_summary.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayflow.results import signing, storage, verification
from rayflow.results.experiment import Experiment
from rayflow.results.records import TUNE_AUTO_KEYS
from rayflow.runtime.environment import scoped_env
from rayflow.security.printable import printable_line
from rayflow.workloads.tune_fit import (
    first_result_wait,
    fit_watching_interrupts,
    notebook_reporter,
    result_files,
    trials_in_prestarted_workers,
    without_rays_resume_hint,
)

if TYPE_CHECKING:
    from ray.tune import Tuner


@dataclass
class TuneJob:
    """One Tune experiment, as every tuning workload (workload=tune and its presets, a Train
    sweep, RLlib) hands it to run_tune: the public seam between a workload's keys and Tune."""

    trainable: Callable
    param_space: dict
    metric: str
    mode: str
    num_samples: int
    resources: dict | None  # None: the trainable asks for its own (RLlib algorithms)
    scheduler: Any = None
    search_alg: Any = None
    max_failures: int = 0
    checkpoints_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    reuse_actors: bool = True
    max_concurrent_trials: int | None = None
    # Trials Tune creates ahead, each asking for a placement group: Tune's default of 200 serves
    # an autoscaler's demand, but on a cluster of known size more than fit at once only add
    # placement-group requests and removals to every trial (0.8 s over 128 trials on 2 slots).
    max_pending_trials: int | None = None
    checkpoint_frequency: int = 0  # class trainables (RLlib): Tune checkpoints every N iterations
    checkpoint_at_end: bool | None = None
    stop: dict | None = None
    time_budget_s: float | None = None
    callbacks: list = field(default_factory=list)
    verbose: int = 1
    # False where a result may rightly lack the metric: RLlib's return exists only once an
    # episode has ended, and an iteration may end none (a long episode, a busy machine). Tune's
    # strict check would end the run at that result, as if the metric were misspelt.
    metric_in_every_result: bool = True
    # For the summary and the plots: what counts a trial's progress (the scheduler's time_attr),
    # how far a trial may go in it (None: no limit known), the scheduler's name for "stopped
    # early by ..." (None: no scheduler stops trials early), the metrics the table shows.
    time_attr: str = "training_iteration"
    max_t: int | None = None
    scheduler_label: str | None = None
    shown_metrics: tuple[str, ...] = ()
    # What the run found, for the summary: the keys a trial reported without the metric (None:
    # every result had it)
    reported_instead: tuple[str, ...] | None = None


# Tune's strict metric check, and the result it quotes (ray.tune.execution.tune_controller)
_NO_METRIC = "did not include the specified metric"
_RESULT_KEY = re.compile(r"'([^'\\]{1,200})': ")


def reported_instead(err: BaseException) -> tuple[str, ...] | None:
    """The keys the result Tune refused for lacking the metric held (Tune's own counters left
    out), or None where `err` is another error. Read from Tune's message as text."""
    text = str(err)
    if _NO_METRIC not in text:
        return None
    quoted = text.rpartition("Result: ")[2]
    keys = {k for k in _RESULT_KEY.findall(quoted) if "/" not in k and k not in TUNE_AUTO_KEYS}
    # what a trial reported, shown as text: a key's control characters escaped
    return tuple(sorted(printable_line(k) for k in keys))


def _saved_results(location: str):
    """The ResultGrid of the experiment state Tune saved before it stopped."""
    from ray.tune import ExperimentAnalysis, ResultGrid

    # Its warning that trials whose first result was refused have no result files says nothing
    # the summary does not
    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return ResultGrid(ExperimentAnalysis(location))
    finally:
        quiet.setLevel(level)


def run_tune(job: TuneJob, experiment: Experiment, resume: bool = False, env=None):
    """Run (or continue) the experiment; returns (ResultGrid, interrupted). Tune writes to its
    location (a folder, or an object store: then its mirror is pulled once fit() is over, for what
    rayflow reads). `env`: what the trials need from this process's environment where their
    nodes do not have it (an object store's settings), given to them as their runtime env."""
    from ray import tune

    trainable = (
        job.trainable
        if job.resources is None
        else tune.with_resources(job.trainable, job.resources)
    )
    if resume and experiment.has("tuner.pkl"):  # else it stopped before Tune started: start anew
        # what Tune unpickles (tuner.pkl, its experiment state, the searcher's and the trials'
        # pickles) is as the resume verified it
        verification.check_unchanged(experiment.location)
        tuner = tune.Tuner.restore(
            experiment.location,
            trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=job.param_space,
        )
        note_restarts(experiment.location)
    else:
        tuner = _new_tuner(job, experiment, trainable)
    from ray.tune.error import TuneError

    try:
        with (
            trials_in_prestarted_workers(env or {}),
            scoped_env(_tune_env(job)),
            without_rays_resume_hint(),
        ):
            outcome = fit_watching_interrupts(tuner)
    except TuneError as err:
        # Tune ends the run at the first result without the metric (its strict check): what ran
        # is summarised, and the run fails in one line naming workload.metric
        job.reported_instead = reported_instead(err)
        if job.reported_instead is None:
            raise
        outcome = (_saved_results(experiment.location), False)
    finally:  # however fit() ended: what Tune saved is signed at once
        signing.sign_now(experiment.location)
    experiment.pull("resume" if resume else "storage_path")
    return outcome


def _new_tuner(job: TuneJob, experiment: Experiment, trainable: Any) -> Tuner:
    """A Tuner for a new experiment, with the job's settings."""
    from ray import tune

    return tune.Tuner(
        trainable,
        param_space=job.param_space,
        tune_config=tune.TuneConfig(
            metric=job.metric,
            mode=job.mode,
            num_samples=job.num_samples,
            scheduler=job.scheduler,
            search_alg=job.search_alg,
            time_budget_s=job.time_budget_s,
            reuse_actors=job.reuse_actors,
            max_concurrent_trials=job.max_concurrent_trials,
        ),
        run_config=tune.RunConfig(
            name=experiment.name,
            storage_path=storage.parent(experiment.location),
            failure_config=tune.FailureConfig(max_failures=job.max_failures),
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=job.checkpoints_to_keep,
                checkpoint_score_attribute=job.checkpoint_score_attribute,
                checkpoint_score_order=job.checkpoint_score_order,
                checkpoint_frequency=job.checkpoint_frequency,
                checkpoint_at_end=job.checkpoint_at_end,
            ),
            stop=job.stop,
            callbacks=[*(job.callbacks or []), *result_files(), first_result_wait()],
            verbose=job.verbose,
            progress_reporter=notebook_reporter(),
        ),
    )


def _tune_env(job: TuneJob) -> dict[str, str]:
    """The environment variables Tune runs under, for this job."""
    # Tune adds its CSV, JSON and TensorBoard loggers unless told not to; the TensorBoard one
    # imports tensorboardX and with it torch in the driver (1.5-2 s before the first trial
    # starts, every run). rayflow's results go to MLflow: only the files Tune's ResultGrid and
    # resume read are kept (tune_fit.result_files), and the driver imports no torch for them.
    env = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
    # Tune's new output prints its experiment box even when silent; its legacy one, nothing
    if job.verbose == 0:
        env["RAY_AIR_NEW_OUTPUT"] = "0"
    if not job.metric_in_every_result:
        env["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    # the user's own setting wins
    if job.max_pending_trials and "TUNE_MAX_PENDING_TRIALS_PG" not in os.environ:
        env["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(1, job.max_pending_trials))
    return env


def note_restarts(path: str) -> None:
    """One line, on resume, for the unfinished trials that saved no checkpoint (a trainable that
    checkpoints nothing, or a trial stopped before its first): Tune runs them again from their
    first iteration, not from where they stopped."""
    from ray.tune import ExperimentAnalysis

    trials = ExperimentAnalysis(path).trials  # the state Tuner.restore continues
    fresh = [t for t in trials if t.status != "TERMINATED" and t.checkpoint is None]
    if fresh:
        print(
            f"[rayflow] resume: {len(fresh)} unfinished trial(s) saved no checkpoint (the "
            "trainable saves none, or they stopped before their first): they restart from the "
            "start",
            flush=True,
        )
