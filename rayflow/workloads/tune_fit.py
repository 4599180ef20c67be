"""What goes around Tuner.fit() in rayflow's one Tune path (rayflow.workloads.tune_runner).

The callbacks and reporter rayflow gives every Tuner (the wait for the first result shown, the
result files resume reads, a notebook's table that keeps rayflow's lines), what it changes in
this process while fit() runs (Tune's resume hint left out of its log, trials let into the
workers Ray prestarted), and whether an interrupt made Tune stop early. Kept apart from building
and restoring the Tuner: each is a small piece of Tune's machinery, read on its own.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading


def first_result_wait():
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


def notebook_reporter():
    """In a Jupyter kernel Tune draws its progress table as HTML, and by default clears the
    cell's output first, which would wipe rayflow's lines above it (the Spark session used,
    each start-up phase): keep them. None elsewhere (Tune's own terminal output)."""
    from ray.tune.experimental.output import IS_NOTEBOOK

    if not IS_NOTEBOOK:
        return None
    from ray.tune import JupyterNotebookReporter

    return JupyterNotebookReporter(overwrite=False)


# What Tune logs (ray.tune.tune) when a run is interrupted: its own `Tuner.restore(...)` call.
# rayflow prints the one instruction that works for its runs, `python -m rayflow resume=PATH`.
RAY_RESUME_HINTS = ("Resume experiment with:", "Resume training with:")


class _NoResumeHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(hint in record.getMessage() for hint in RAY_RESUME_HINTS)


@contextlib.contextmanager
def without_rays_resume_hint():
    """Ray Tune's resume instruction left out of its log while the run lasts."""
    logger, hint = logging.getLogger("ray.tune.tune"), _NoResumeHint()
    logger.addFilter(hint)
    try:
        yield
    finally:
        logger.removeFilter(hint)


def result_files() -> list:
    """progress.csv and result.json per trial: ResultGrid's metrics, plots and resume read them."""
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    return [CSVLoggerCallback(), JsonLoggerCallback()]


@contextlib.contextmanager
def trials_in_prestarted_workers(env: dict[str, str]):
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
