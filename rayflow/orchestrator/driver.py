"""A job run in this process, its driver connected to the cluster (local, attach, spark; and a
submitted run on the head, which is `backend=attach` there), in the experiment folder it holds.

Read top-down, one step a function: the workload prepares what it needs here; the cluster is
acquired and `compute=auto` resolved; the MLflow parent run starts (or, on resume, goes on) and the
experiment's state is written (on resume, onto the state the preflight read: Plan.resumed); the
workload runs under the watches (the placement watch, the node peak); the outcome is reported;
what did not finish raises, Ctrl-C and the terminating signals become the exceptions the CLI and
rayflow.run turn into exit codes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rayflow.backends import ClusterHandle
from rayflow.errors import ConfigError, RunFailed, RunInterrupted, Terminated
from rayflow.orchestrator.cluster import SharedCluster
from rayflow.orchestrator.preflight import Plan
from rayflow.orchestrator.report import report
from rayflow.orchestrator.resume import (
    RESUMED_GROUPS,
    carried,
    group_choices,
    resume_command,
    resumed_keys,
)
from rayflow.results.experiment import Experiment, held_state, write_state
from rayflow.results.run_result import RunResult, result_line
from rayflow.results.signing import RUN_LOG
from rayflow.results.storage import join as storage_join
from rayflow.runtime.environment import scoped_env
from rayflow.runtime.node_usage import NodePeak
from rayflow.runtime.placement import PlacementWatch
from rayflow.runtime.ray_logs import plain_ray_logs
from rayflow.runtime.run_log import RunLog, run_log
from rayflow.runtime.signals import termination_exit_code
from rayflow.runtime.verbosity import level
from rayflow.schema.values import to_container
from rayflow.security.redaction import redact
from rayflow.security.result_channel import emit
from rayflow.tracking.tracker import Tracker, git_commit
from rayflow.workloads import RunContext


def run_here(plan: Plan, cluster: SharedCluster, experiment: Experiment) -> RunResult:
    """The job of `plan` on `cluster` (started by the first job that acquires it), in this process;
    its RunResult. Raises RunFailed, RunInterrupted or Terminated after its own clean-up."""
    cfg = plan.cfg
    # missing data fails before Ray starts
    plan.workload.prepare(cfg, here=plan.backend.traits.shares_filesystem)
    tracker = Tracker(cfg)
    result = _new_result(plan, experiment, tracker)
    # the experiment's state, as the preflight read it (read again only where another run
    # changed it since: held_state)
    state = held_state(plan.resumed) if plan.resumed else {}
    hint = _resume_hint(plan, experiment.location)
    status = "FAILED"
    import ray  # noqa: F401  (its log handler exists before plain_ray_logs filters it)

    with (
        scoped_env(_job_env(tracker)),
        plain_ray_logs(),
        run_log(experiment.dir / RUN_LOG, level(cfg.get("verbose")), tracker.libraries) as log,
    ):
        try:
            handle, started = cluster.acquire()
            log.take_worker_lines()
            resolve_compute(cfg)
            _start_tracking(plan, cluster.spec, handle, started, tracker, state, experiment)
            result.mlflow_run_id, result.mlflow_experiment_id = (
                tracker.run_id,
                tracker.experiment_id,
            )
            result.summary, peak = _run_watched(plan, tracker, experiment, result)
            report(cfg, tracker, result.summary, experiment, peak, plan.workload)
            _raise_unfinished(result, hint)
            status = "FINISHED"
            return result
        except (KeyboardInterrupt, SystemExit) as stop:
            status = "KILLED"
            _translate_interrupt(stop, result, hint)
            raise
        finally:
            _log_kept(log, experiment, tracker)
            tracker.end(status)
            # a submitted job: its result, for the side that submitted it
            if plan.on_head is not None:
                emit(result_line(result, status))  # one write: Ray's log thread prints meanwhile


def _log_kept(log: RunLog, experiment: Experiment, tracker: Tracker) -> None:
    """The run's log into its MLflow parent run and its object store, and where to read it when
    the terminal did not show all of it."""
    if log.path is None or not log.path.exists():
        return
    tracker.log_artifact(str(log.path))
    try:
        experiment.push(RUN_LOG)
    except OSError as err:  # pyarrow's: the store failed; the run's outcome still stands
        print(f"rayflow: warning: the run's log stays in {log.path}: {err}", file=sys.stderr)
    if log.hidden:
        where = storage_join(experiment.location, RUN_LOG) if experiment.remote else log.path
        lines = f"{log.hidden} line{'s' if log.hidden != 1 else ''}"
        print(f"log: {where}   (and {lines} of Ray's and MLflow's own; verbose=1 prints them too)")


def _new_result(plan: Plan, experiment: Experiment, tracker: Tracker) -> RunResult:
    cfg, workload = plan.cfg, plan.workload
    return RunResult(
        str(cfg.workload.name),
        None,
        experiment.dir,
        tuple(plan.overrides),
        redact(to_container(cfg)),
        tracker.absolute_uri if tracker.enabled else None,
        tracker.experiment or None,
        trial_metrics=workload.metrics(cfg),
        trial_params=workload.params(cfg),
        experiment=experiment.location,
    )


def resolve_compute(cfg: DictConfig) -> None:
    """compute=auto: one GPU per trial when the connected cluster has GPUs, else the CPU."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.compute.device == "cuda" and gpus <= 0:
        raise ConfigError("compute", "compute=gpu but the cluster has no GPU")
    if cfg.compute.device == "auto":
        OmegaConf.update(cfg, "compute.gpus_per_trial", 1 if gpus > 0 else 0)


def _start_tracking(
    plan: Plan,
    spec: str,
    handle: ClusterHandle,
    started: bool,
    tracker: Tracker,
    state: dict[str, Any],
    experiment: Experiment,
) -> None:
    """The MLflow parent run: a new one, or on resume the experiment's own; the cluster's start-up
    figures where this job started it; then the experiment's state, for a later resume."""
    cfg = plan.cfg
    on_head = plan.on_head
    spec = on_head.spec if on_head and on_head.spec else spec  # the cluster a submitted run ran on
    tracker.start(
        cfg,
        spec,
        tags={**_parent_tags(plan, experiment.location), **handle.tags},
        resume_run_id=state.get("mlflow_run_id"),
    )
    if on_head and on_head.metrics:  # the start-up of the cluster that submitted this job
        tracker.log_metrics(on_head.metrics)
    elif started:
        tracker.log_metrics(handle.metrics)
    # what a resume composes again (rayflow.orchestrator.resume): the choices and the keys it may
    # restore, masked, and the keys of the secrets its command leaves out (it asks for them)
    config = to_container(cfg)
    choices = {g: c for g, c in group_choices(list(plan.overrides)).items() if g in RESUMED_GROUPS}
    kept = {k: config[k] for k in resumed_keys(cfg) if k in config}
    saved = {
        "mlflow_run_id": tracker.run_id,
        "choices": choices,
        "config": kept,
        "asks": _carried(plan)[1],
        "project": _project(plan),  # the folder it was run from: resume=true picks this folder's
    }
    write_state(experiment, {**state, **redact(saved)})  # keeps what the workload saved (resume)


def _project(plan: Plan) -> str:
    """The folder the run was started from: a submitted job's, its submitter's."""
    origin = plan.on_head.origin if plan.on_head else {}
    if isinstance(origin.get("project"), str):
        return str(origin["project"])
    return os.getcwd()


def _torch_version() -> str:
    """torch's version as its trials see it, read without importing torch here (a second of a
    driver's start-up, where only the trials train)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:  # a torch without distribution metadata (built in place)
        import torch

        return str(torch.__version__)


def _parent_tags(plan: Plan, path: str) -> dict[str, Any]:
    import ray

    cfg = plan.cfg
    return {
        # vm, not the job's attach
        "backend": plan.on_head.backend if plan.on_head else cfg.backend.name,
        "workload": cfg.workload.name,
        "ray_version": ray.__version__,
        "torch_version": _torch_version(),
        "git_commit": git_commit(cfg.workload.get("trainable")),
        "experiment_dir": path,
    }


def _run_watched(
    plan: Plan, tracker: Tracker, experiment: Experiment, result: RunResult
) -> tuple[Any, NodePeak]:
    """The workload's run, watched: a demand no node can place for schedule_timeout_s stops it
    (RunFailed: Tune and Train saved their state); the node count at its peak is kept."""
    cfg = plan.cfg
    keys = sorted({b.keys[r] for b in plan.bundles for r, amount in b.resources.items() if amount})
    hint = f"lower {', '.join(keys)} or use a cluster with bigger nodes"
    context = RunContext(
        tracker,
        experiment.dir,
        cfg.resume is not False,
        plan.trial_slots,
        experiment,
        _node_env(plan, experiment),
    )
    with NodePeak() as peak, PlacementWatch(float(cfg.schedule_timeout_s), hint) as watch:
        try:
            summary = plan.workload.run(cfg, context)
        except (KeyboardInterrupt, SystemExit):
            if watch.message is None:
                raise
    if watch.message is not None:
        raise RunFailed(watch.message, result)
    return summary, peak


def _node_env(plan: Plan, experiment: Experiment) -> dict[str, str]:
    """An object store's settings for the trials, where their nodes do not have this process's
    environment: not a submitted job's (its runtime env holds them for every worker,
    rayflow.orchestrator.submission), not the nodes this process started (they inherit it)."""
    from rayflow.results.storage import STORAGE_ENV

    if not experiment.remote or plan.backend.traits.shares_filesystem or plan.on_head is not None:
        return {}
    return {k: os.environ[k] for k in STORAGE_ENV if os.environ.get(k)}


def _carried(plan: Plan) -> tuple[list[str], list[str]]:
    """What the resume command carries (rayflow.orchestrator.resume.carried), and the keys of the
    secrets it leaves out: this invocation's own; a submitted run's, the side's that submitted it
    (its backend, not the job's `attach`)."""
    if plan.on_head is not None:
        origin = plan.on_head.origin
        return list(origin.get("carried", [])), list(origin.get("asks", []))
    return carried(plan.overrides)


def _resume_hint(plan: Plan, where: str) -> str:
    """The one instruction that continues the experiment at `where`, pasted as it is printed; a
    workload rayflow runs for another entry point (the Hydra sweeper) says how that one does."""
    again = getattr(plan.workload, "RESUME", None)
    return f"Continue with: {again or resume_command(where, _carried(plan)[0])}"


def _raise_unfinished(result: RunResult, hint: str) -> None:
    """A run interrupted (its state saved) or with errored trials ends in its exception."""
    summary = result.summary
    if summary.interrupted:
        raise RunInterrupted(f"interrupted; state saved. {hint}", result)
    if getattr(summary, "reported_instead", None) is not None:  # a metric no trial reports
        raise RunFailed(
            f"workload.metric: no trial reports {summary.metric!r}; {summary.reports_line()}. "
            f"{hint}",
            result,
        )
    if summary.errored:
        cause = f": {summary.error}" if summary.error else ""
        raise RunFailed(
            f"{summary.errored} trial(s) errored{cause}; their errors are above and in "
            f"{result.location}. {hint}",
            result,
        )


def _translate_interrupt(stop: BaseException, result: RunResult, hint: str) -> None:
    """A terminating signal becomes Terminated (exit 128 + N), Ctrl-C RunInterrupted (exit 130);
    either way the state is saved and the resume command printed. Anything else goes on as it is."""
    code = termination_exit_code()
    if code:
        print(f"rayflow: stopped by signal {code - 128}; state saved. {hint}", file=sys.stderr)
        raise Terminated(code) from None
    if isinstance(stop, KeyboardInterrupt) and not isinstance(stop, RunInterrupted):
        raise RunInterrupted(f"interrupted; state saved. {hint}", result) from None


def _job_env(tracker: Tracker) -> dict[str, str]:
    env = {}
    # a pipe, a CI log, a notebook cell: Ray's log prefixes without colour codes
    if not sys.stdout.isatty():
        env["RAY_COLOR_PREFIX"] = os.environ.get("RAY_COLOR_PREFIX", "0")
    if tracker.enabled:  # Ray nodes that Spark or Kubernetes start get it forwarded
        env["MLFLOW_TRACKING_URI"] = tracker.absolute_uri
        # MLflow's own HTTP defaults retry an unreachable server for minutes: bound them.
        for key, value in (
            ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"),
            ("MLFLOW_HTTP_REQUEST_TIMEOUT", "60"),
            # rayflow prints the run's address in the UI itself; MLflow's own "View run ... at"
            # would say it again as each run ends, the parent's and every trial's
            ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true"),
        ):
            env[key] = os.environ.get(key, value)
    return env
