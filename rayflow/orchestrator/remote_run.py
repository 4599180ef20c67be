"""A run on a backend that submits it (vm, kuberay): rayflow itself, as a Ray Job on the head.

The job is the same command with `backend=attach` (joining the cluster it runs on), so the results
table, the MLflow runs, the checkpoints and `resume` are those a local run makes. Its command line
is fixed (`python -m rayflow.job_entry`): its overrides go as its request, never on argv
(rayflow.orchestrator.submission). It ends with its result line (rayflow.results.run_result), read
here into the RunResult this returns; its driver log goes into the parent MLflow run
(`job/driver.log`) before the cluster goes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rayflow.errors import RunFailed, Terminated
from rayflow.orchestrator.cluster import SharedCluster
from rayflow.orchestrator.clusters import job_ran
from rayflow.orchestrator.job_files import job_files
from rayflow.orchestrator.job_logs import JOB_LOG, print_last_lines
from rayflow.orchestrator.preflight import Plan
from rayflow.orchestrator.resume import carried, resume_command
from rayflow.orchestrator.submission import (
    FORWARDED_ENV,
    SUBMITTED_BY,
    SUBMITTED_FROM,
    SUBMITTED_METRICS,
    SUBMITTED_SPEC,
    Submitted,
    job_entrypoint,
    job_overrides,
    submit,
)
from rayflow.results.experiment import locate, on_object_store
from rayflow.results.run_result import (
    RESULT_MARKER,
    RunResult,
    returned_mlflow_run,
    returned_result,
)
from rayflow.results.storage import is_uri
from rayflow.results.storage import join as storage_join
from rayflow.results.storage import name as storage_name
from rayflow.results.trust import delegation_env
from rayflow.runtime.signals import termination_exit_code
from rayflow.schema.values import to_container
from rayflow.security.printable import printable
from rayflow.security.redaction import mask_text, redact
from rayflow.tracking.tracker import Tracker


def _request(plan: Plan, tracker: Tracker) -> dict[str, list[str]]:
    """The job's overrides, with what this side resolved: its own folders, where the nodes share
    this machine's files (`~` is the head's own elsewhere), and the tracking URI made absolute."""
    cfg = plan.cfg
    absolute = {"ray_auth_mode": str(cfg.ray_auth_mode)}
    if plan.backend.traits.shares_filesystem:
        absolute.update(
            {
                key: str(Path(str(value)).expanduser().resolve())
                for key, value in _local_folders(plan).items()
                if not is_uri(value)
            }
        )
    if cfg.resume is False:
        # named here, so this side knows where the experiment goes (its resume command, the
        # experiment its signing key is for)
        absolute["experiment_name"] = str(cfg.experiment_name)
    if tracker.enabled:
        absolute["tracking.uri"] = tracker.absolute_uri
    return {"overrides": job_overrides(plan.overrides, absolute)}


def _local_folders(plan: Plan) -> dict[str, object]:
    """The keys whose kind is a folder of this machine (storage_path, a preset's data.root), by the
    models that declare them."""
    from omegaconf import OmegaConf

    from rayflow.orchestrator.compose import plain, section_models
    from rayflow.schema.kinds import local_folder_keys

    data = plain(plan.cfg)
    keys = [
        f"{where}.{k}" if where else k
        for where, model in section_models(data).items()
        for k in local_folder_keys(model)
    ]
    return {
        key: OmegaConf.select(plan.cfg, key)
        for key in keys
        if OmegaConf.select(plan.cfg, key) is not None
    }


# A job whose experiment outlives the cluster (an object store) is stopped as Ctrl-C stops a local
# run, so Tune saves its state there before it ends; Ray's job supervisor reads these from the
# job's environment, and kills the job after the grace given (its default: SIGTERM, 3 s).
GRACEFUL_STOP = {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "30"}


def _env(plan: Plan, cluster: SharedCluster, started: bool) -> dict[str, str]:
    handle = cluster.handle
    assert handle is not None
    withheld = handle.submission.withheld if handle.submission else ()
    return {
        "PYTHONUNBUFFERED": "1",
        SUBMITTED_BY: cluster.backend.name,
        SUBMITTED_SPEC: cluster.spec,
        SUBMITTED_METRICS: json.dumps(handle.metrics if started else {}),
        SUBMITTED_FROM: json.dumps(_submitted_from(plan)),
        **{k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k) and k not in withheld},
        **(GRACEFUL_STOP if on_object_store(plan.cfg) else {}),
        **delegation_env(_experiment_name(plan)),  # it signs the experiment as this user's
    }


def _submitted_from(plan: Plan) -> dict[str, Any]:
    """What this side's command line gives a resume (rayflow.orchestrator.resume.carried): the job
    prints the resume command as this side would, not with the job's `backend=attach` to a head
    that will be gone."""
    shown, asks = carried(plan.overrides)
    return {"carried": shown, "asks": asks, "project": os.getcwd()}


def _experiment_name(plan: Plan) -> str:
    """The name of the experiment the job writes (a new one may get a `-N` suffix there)."""
    cfg = plan.cfg
    return storage_name(str(cfg.resume)) if cfg.resume is not False else str(cfg.experiment_name)


def run_submitted(plan: Plan, cluster: SharedCluster) -> RunResult:
    """Start (or reuse) the cluster, run this same command on it as a Ray Job, and end with the
    job's outcome (RunFailed for a job that did not succeed, after its last lines)."""
    cfg, tracker = plan.cfg, Tracker(plan.cfg)
    try:
        handle, started = cluster.acquire()
        assert handle.submission is not None
        # their size was checked by the preflight
        files = job_files(cfg, in_place=handle.submission.in_place)
        if plan.shipped:
            files["py_modules"] = [*files.get("py_modules", []), *plan.shipped]
        done = submit(
            handle,
            job_entrypoint(handle.submission.python),
            _env(plan, cluster, started),
            RESULT_MARKER,
            runtime_env=files,
            request=_request(plan, tracker),
            verbose=cfg.get("verbose", 0),
        )
    except (KeyboardInterrupt, SystemExit):
        _stopped(_outliving(plan))
        raise
    except BaseException:
        command = cluster.handle.teardown_command if cluster.handle is not None else None
        if command:  # rayflow stops it on its way out; this is for a client that dies first
            print(
                f"[rayflow] should anything of the cluster outlive this process: {command}",
                file=sys.stderr,
            )
        raise
    return _returned(plan, cluster, tracker, done)


def _outliving(plan: Plan) -> str:
    """What outlives the cluster: an experiment on an object store, continued on a new cluster
    by the command this returns ("" where the experiment stays on the cluster's own disks). A
    resume's `resume` is the experiment's location already (rayflow.orchestrator.resume)."""
    cfg = plan.cfg
    # a workload rayflow runs for another entry point (the Hydra sweeper) is continued by that
    # one, which says how (its RESUME); rayflow's own command line would not continue it
    if not on_object_store(cfg) or getattr(plan.workload, "RESUME", None):
        return ""
    where = cfg.resume if isinstance(cfg.resume, str) else None
    where = where or storage_join(str(cfg.storage_path), str(cfg.experiment_name))
    command = resume_command(where, carried(plan.overrides)[0])
    return f" Continue it on a new cluster with: {command}"


def _stopped(outliving: str) -> None:
    """Ctrl-C or a terminating signal while the job ran: it was stopped; exit as a local run
    does, with the resume command where the experiment outlives the cluster."""
    code = termination_exit_code()
    if code:
        print(
            f"rayflow: stopped by signal {code - 128}; the job was stopped.{outliving}",
            file=sys.stderr,
        )
        raise Terminated(code) from None
    if sys.exc_info()[0] is KeyboardInterrupt:
        print(f"rayflow: interrupted; the job was stopped.{outliving}", file=sys.stderr)
        raise SystemExit(130) from None


def _returned(plan: Plan, cluster: SharedCluster, tracker: Tracker, done: Submitted) -> RunResult:
    """The RunResult the job's signed line gives back; a failed job's last lines, then RunFailed.
    A failed job's line is read for its MLflow parent run only, so its log goes there."""
    cfg, outcome = plan.cfg, done.outcome
    # a resume's as the preflight located it; a new one's is where it goes (nothing read)
    located = plan.resumed.experiment if plan.resumed else locate(cfg)
    base = RunResult(
        str(cfg.workload.name),
        None,
        located.dir,
        tuple(plan.overrides),
        redact(to_container(cfg)),
        tracker.absolute_uri if tracker.enabled else None,
        tracker.experiment or None,
        experiment=located.location,
    )
    if done.succeeded:
        result, _ = returned_result(outcome.log, base, done.key)
    else:
        result = base
        result.mlflow_experiment_id, result.mlflow_run_id = returned_mlflow_run(
            outcome.log, done.key
        )
    log = done.log()
    where = keep_driver_log(cfg, cluster.spec, tracker, result, log, outcome.job_id)
    if cluster.handle is not None and where:  # `rayflow logs` finds it once the cluster is gone
        job_ran(cluster.handle, outcome.job_id, tracker.absolute_uri, result.mlflow_run_id)
    if not done.succeeded:
        print_last_lines(log, outcome.job_id, where)
        raise RunFailed(
            f"the job on backend={cluster.backend.name} ended {outcome.status}"
            + (f": {outcome.error}" if outcome.error else "")
            + _outliving(plan)
        )
    if result.summary is not None and result.summary.table().strip():
        first = result.summary.table().strip().splitlines()[0]
        # the stream missed the job's table
        if not any(line.strip() == first for line in outcome.streamed):
            print(result.summary.table(), flush=True)
    return result


def keep_driver_log(
    cfg: DictConfig, spec: str, tracker: Tracker, result: RunResult, log: str, job_id: str
) -> str | None:
    """The job's driver log into its parent MLflow run (one made here, FAILED, when the job ended
    before it made its own), so it can be read once the cluster is gone. Returns where it went.
    The log is stored masked. A tracking server that went away while the job ran costs the
    stored log and one warning line, never the run's outcome or its result."""
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    if not tracker.enabled:
        return None
    run_id = result.mlflow_run_id
    try:
        if run_id is None:  # the job failed before its run began (an import, its own preflight)
            tracker.start(
                cfg,
                spec,
                tags={"backend": cfg.backend.name, "workload": cfg.workload.name, "job_id": job_id},
            )
            tracker.end("FAILED")
            run_id = result.mlflow_run_id = tracker.run_id
            result.mlflow_experiment_id = tracker.experiment_id
        tracker.client.log_text(run_id, mask_text(log), JOB_LOG)
    except (MlflowException, RequestException, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(
            "rayflow: warning: the job's log was not stored in MLflow "
            f"({mask_text(tracker.absolute_uri)}): {type(err).__name__}: "
            f"{printable(mask_text(first))}",
            file=sys.stderr,
            flush=True,
        )
        return None
    return f"MLflow run {run_id}, {JOB_LOG}"
