"""The one Ray Tune path: every workload that tunes, and scripts/bench.py, go through run_tune.

It adds what rayflow needs around a plain Tuner and nothing per result: experiment
folders that `resume=true` can find, Tuner.restore for them, actor reuse (a reused
trial process keeps its loaded data set), and the end-of-run summary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rayflow.results import signing, storage, verification
from rayflow.results.experiment import Experiment
from rayflow.results.records import RAN_TO_END, TUNE_AUTO_KEYS
from rayflow.runtime.environment import scoped_env
from rayflow.security.printable import printable_line

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


def _first_result_wait():
    """A Tune callback that shows the wait for the first trial's first result: the trial's
    process starts and imports torch (and RLlib) before it reports, seconds with nothing printed."""
    from ray.tune import Callback

    from rayflow.runtime.progress import phase

    class FirstResult(Callback):
        def __init__(self):
            self._phase = None

        def __getstate__(self):
            # Tune pickles its callbacks with the experiment; a live phase is not state
            return {"_phase": None}

        def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
            self._phase = phase(
                "waiting for the first trial's first result (its process starts and imports the "
                "trainable's modules)",
                "tune",
            )
            self._phase.__enter__()

        def _close(self, instead: str | None = None):
            """End the line: `... done` on a first result, else what ended the wait instead."""
            if self._phase is not None:
                if instead:
                    self._phase.done(instead)
                self._phase.__exit__(None, None, None)
                self._phase = None

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self._close()

        def on_trial_error(self, iteration, trials, trial, **info):
            self._close(f"no first result: trial {trial.trial_id} errored")

        def on_experiment_end(self, trials, **info):
            if trials and all(t.status == "TERMINATED" for t in trials):
                self._close("every trial had finished already (nothing left to run)")
            else:
                self._close("the search ended before a trial's first result was taken")

    return FirstResult()


def _notebook_reporter():
    """In a Jupyter kernel Tune draws its progress table as HTML, and by default clears the
    cell's output first, which would wipe rayflow's lines above it (the Spark session used,
    each start-up phase): keep them. None elsewhere (Tune's own terminal output)."""
    from ray.tune.experimental.output import IS_NOTEBOOK

    if not IS_NOTEBOOK:
        return None
    from ray.tune import JupyterNotebookReporter

    return JupyterNotebookReporter(overwrite=False)


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
            _trials_in_prestarted_workers(env or {}),
            scoped_env(_tune_env(job)),
            _without_rays_resume_hint(),
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
            callbacks=[*(job.callbacks or []), *_result_files(), _first_result_wait()],
            verbose=job.verbose,
            progress_reporter=_notebook_reporter(),
        ),
    )


def _tune_env(job: TuneJob) -> dict[str, str]:
    """The environment variables Tune runs under, for this job."""
    # Tune adds its CSV, JSON and TensorBoard loggers unless told not to; the TensorBoard one
    # imports tensorboardX and with it torch in the driver (1.5-2 s before the first trial
    # starts, every run). rayflow's results go to MLflow: only the files Tune's ResultGrid and
    # resume read are kept (_result_files), and the driver imports no torch for them.
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


# What Tune logs (ray.tune.tune) when a run is interrupted: its own `Tuner.restore(...)` call.
# rayflow prints the one instruction that works for its runs, `python -m rayflow resume=PATH`.
RAY_RESUME_HINTS = ("Resume experiment with:", "Resume training with:")


class _NoResumeHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(hint in record.getMessage() for hint in RAY_RESUME_HINTS)


@contextlib.contextmanager
def _without_rays_resume_hint():
    """Ray Tune's resume instruction left out of its log while the run lasts."""
    logger, hint = logging.getLogger("ray.tune.tune"), _NoResumeHint()
    logger.addFilter(hint)
    try:
        yield
    finally:
        logger.removeFilter(hint)


def _result_files() -> list:
    """progress.csv and result.json per trial: ResultGrid's metrics, plots and resume read them."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [CSVLoggerCallback(), JsonLoggerCallback()]


@contextlib.contextmanager
def _trials_in_prestarted_workers(env: dict[str, str]):
    """Tune gives every trial actor the runtime_env {"env_vars": {"PL_DISABLE_FORK": "1"}}
    (ray.tune.execution.class_cache: a PyTorch Lightning workaround; rayflow's workloads do not
    use Lightning). Any runtime_env makes Ray start a new process for the actor rather than give
    it one of the idle workers its raylet prestarted (and that imported the workload's modules:
    LocalCluster.preload_worker_imports), which puts 2-5 s of process start and imports in front
    of every trial. Without the variable the trial's runtime_env is empty and those workers fit.
    Variables Tune forwards from the driver's environment (AWS keys, Ray Train's) still go, and
    `env` with them (then in a new process)."""
    from ray.tune.execution import class_cache

    saved = dict(class_cache.DEFAULT_ENV_VARS)
    class_cache.DEFAULT_ENV_VARS.pop("PL_DISABLE_FORK", None)
    class_cache.DEFAULT_ENV_VARS.update(env)
    try:
        yield
    finally:
        class_cache.DEFAULT_ENV_VARS.clear()
        class_cache.DEFAULT_ENV_VARS.update(saved)


def _sigint_sentinel(signum, frame):
    raise KeyboardInterrupt  # Python's default: a second Ctrl-C stops Tune's last save


def fit_watching_interrupts(tuner):
    """tuner.fit(), and whether Ctrl-C (or SIGUSR1) made Tune stop early and save its state.

    Tune swaps in its own SIGINT handler for the run; on a stop signal it puts back the
    handler it found, and otherwise leaves its own in place. The trials it stops are
    marked TERMINATED, so the handler is the only trace of an interrupt after fit().
    """
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit(), False
    previous = signal.signal(signal.SIGINT, _sigint_sentinel)
    try:
        results = tuner.fit()
        return results, signal.getsignal(signal.SIGINT) is _sigint_sentinel
    finally:
        signal.signal(signal.SIGINT, previous)


def no_success_line(
    trials: int, errored: int, error: str | None, interrupted: bool, metric: str = ""
) -> str:
    """The one line of a run with no best trial: why (every trial errored, with the first error;
    the interrupt; no report of the metric), in place of empty best-of headings."""
    what = f"reported {metric}" if metric else "reported a result"
    if errored:
        first = f"; the first error: {error}" if error else ""
        return f"no trial succeeded: {errored} of {trials} errored{first}"
    if interrupted:
        return f"no trial {what} before the interrupt ({trials} trials; resume continues them)"
    return f"no trial {what} ({trials} trials)"


@dataclass
class TuneSummary:
    """The outcome of a Tune experiment, whatever the trainable (rayflow.workloads.Summary)."""

    best_config: dict
    best_metrics: dict
    best_checkpoint: str | None
    trials: int
    errored: int
    interrupted: bool  # Ctrl-C stopped the experiment; its state is saved for resume
    stopped_early: int
    trial_epochs: int  # progress used by every trial together, in `unit`s
    budget_epochs: int  # 0: no budget known (no max_t)
    devices: list[str]
    error: str | None = None  # the first errored trial's error, one line
    metric: str = ""
    shown_metrics: tuple[str, ...] = ()
    scheduler_label: str | None = None
    unit: str = "epoch"
    restarted: int = 0  # trial restarts after a failure (a lost node), from their last checkpoint
    restart_reason: str | None = None  # the first failure's line
    reported_instead: tuple[str, ...] | None = None  # the metric was missing; these were there

    def parent_metrics(self) -> dict[str, float]:
        """What the invocation's parent MLflow run records about the whole search."""
        shown = self.shown_metrics or (self.metric,)
        best = {f"best_{k}": v for k, v in self.best_metrics.items() if k in shown}
        metrics = {
            **best,
            f"trial_{self.unit}s": self.trial_epochs,
            "trial_restarts": self.restarted,
        }
        if self.scheduler_label:
            metrics["trials_stopped_early"] = self.stopped_early
        return metrics

    def table(self) -> str:
        width = max(len(str(k)) for k in self.best_config) if self.best_config else 0
        lines = ["", "== rayflow results =="]
        # no trial reported the metric: no best trial, nothing under a heading
        if not self.best_metrics:
            return "\n".join([*lines, self._no_best_line()])
        if self.best_config:
            lines += [
                "best config:",
                *(f"  {k:<{width}} = {v}" for k, v in self.best_config.items()),
            ]
        for name in self.shown_metrics or (self.metric,):
            value = self.best_metrics.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                lines.append(f"best {name:<13} {value:.4f}")
        by = f" by {self.scheduler_label}" if self.scheduler_label else ""
        if self.interrupted:
            lines.append(
                f"trials: {self.trials} ({self.errored} errored; interrupted before the search "
                "finished)"
            )
        elif self.scheduler_label:
            lines.append(
                f"trials: {self.trials} ({self.stopped_early} stopped early{by}, {self.errored} "
                "errored)"
            )
        else:
            lines.append(f"trials: {self.trials} ({self.errored} errored)")
        if self.budget_epochs:
            share = self.trial_epochs / self.budget_epochs
            lines.append(
                f"trial-{self.unit}s used: {self.trial_epochs} of {self.budget_epochs} "
                f"({share:.0%})"
            )
        else:
            lines.append(f"trial-{self.unit}s used: {self.trial_epochs}")
        return "\n".join([*lines, *self._restarts()])

    def _no_best_line(self) -> str:
        if self.reported_instead is not None:
            return f"no trial reported {self.metric} ({self.trials} trials); {self.reports_line()}"
        return no_success_line(self.trials, self.errored, self.error, self.interrupted, self.metric)

    def reports_line(self) -> str:
        keys = ", ".join(self.reported_instead or ()) or "only Tune's own counters"
        return f"they report: {keys}"

    def _restarts(self) -> list[str]:
        if not self.restarted:
            return []
        why = f"; the first failure: {self.restart_reason}" if self.restart_reason else ""
        return [f"trials restarted: {self.restarted} (each from its last checkpoint{why})"]


def _best_checkpoint(best) -> str | None:
    """Where the best trial's checkpoint is: a folder, or a URI on an object store. A trial that
    ran a Ray Train run reports where that run keeps its checkpoints."""
    if best is None:
        return None
    if best.checkpoint is None:
        return (best.metrics or {}).get("checkpoint_path")
    return storage.checkpoint_uri(best.checkpoint)


def summarize(
    results, job: TuneJob, interrupted: bool, restarts: tuple[int, str | None] = (0, None)
) -> TuneSummary:
    from rayflow.errors import first_error_line

    metric, mode, time_attr = job.metric, job.mode, job.time_attr
    done = [
        r for r in results if r.metrics and metric in r.metrics and r.error is None
    ]  # trials that reported
    best = results.get_best_result(metric=metric, mode=mode, scope="last") if done else None
    progress = [int((r.metrics or {}).get(time_attr, 0) or 0) for r in results]
    # With no limit set (the scheduler's default max_t is not one a trainable knows of), the
    # furthest any trial got is the limit: a trial that ended short of it was stopped early.
    max_t = job.max_t or (max(progress, default=0) or None if job.scheduler_label else None)
    numbers = (
        {
            k: v
            for k, v in (best.metrics or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in TUNE_AUTO_KEYS
        }
        if best
        else {}
    )
    return TuneSummary(
        best_config=dict(best.config) if best else {},
        best_metrics=numbers,
        best_checkpoint=_best_checkpoint(best),
        trials=len(results),
        errored=results.num_errors,
        interrupted=interrupted,
        stopped_early=sum(
            1
            for r in done
            if max_t
            and r.metrics.get(time_attr, max_t) < max_t
            and not r.metrics.get(RAN_TO_END)  # a trial that said it ran to its end
        )
        if job.scheduler_label
        else 0,
        trial_epochs=sum(progress),
        budget_epochs=len(results) * job.max_t
        if job.max_t
        else 0,  # grid_search multiplies num_samples
        devices=sorted({str(r.metrics["device"]) for r in done if "device" in r.metrics}),
        error=first_error_line(results.errors[0]) if results.errors else None,
        metric=metric,
        shown_metrics=job.shown_metrics,
        scheduler_label=job.scheduler_label,
        unit="epoch" if time_attr == "epoch" else "iteration",
        restarted=restarts[0],
        restart_reason=restarts[1],
        reported_instead=job.reported_instead,
    )
