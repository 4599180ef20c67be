"""The jobs of one invocation: start each cluster once, run the jobs that share it, report, stop.

`run_jobs` is what the CLI (one job, or every point of a `-m` sweep) and `rayflow.run` call: a
cluster's lifetime is one `with` block (rayflow.shared_cluster) spanning the consecutive jobs
whose backend config is the same. A backend that submits the run (vm, kuberay) hands each job
to its cluster as a Ray Job (rayflow.remote); the others run it in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf

from rayflow.backends import ClusterBackend
from rayflow.composition import RESUMED_KEYS, Job, _local_files_ok, check_config, group_choices
from rayflow.config import to_container
from rayflow.data import DataSpec, prepare
from rayflow.errors import ConfigError, RunFailed, RunInterrupted, Terminated
from rayflow.node_usage import NodePeak
from rayflow.placement import PlacementWatch, copies_at_once
from rayflow.process_state import reset_termination, scoped_env, termination_exit_code
from rayflow.progress import plain_ray_logs, settle_ray_logs
from rayflow.redaction import literal_secrets_note, redact
from rayflow.result import RESULT_MARKER, RunResult, result_line, returned_result, without_result_line
from rayflow.result_channel import emit
from rayflow.shared_cluster import SharedCluster, cluster_key
from rayflow.tracking import Tracker, git_commit, is_local_store
from rayflow.tuning import claimed_experiment, experiment_dir, read_state, write_state
from rayflow.workloads import workload_for

@dataclass
class RunContext:
    tracker: Tracker
    data: DataSpec
    experiment_dir: Path
    resume: bool
    # Trials of the workload's one bundle that the cluster holds at once at its largest; None
    # when only the running cluster knows its size (attach, a job on a head, sizes left to Spark).
    trial_slots: int | None = None


def _trial_slots(backend, workload, cfg: DictConfig) -> int | None:
    bundles = workload.demand(cfg)
    if len(bundles) != 1 or bundles[0].count != 1:
        return None
    nodes = backend.capacity({r for r, amount in bundles[0].resources.items() if amount})
    return copies_at_once(bundles[0], nodes) if nodes else None


def _resolve_compute(cfg: DictConfig) -> None:
    """compute=auto: one GPU per trial when the connected cluster has GPUs, else the CPU."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.compute.device == "cuda" and gpus <= 0:
        raise ConfigError("compute", "compute=gpu but the cluster has no GPU")
    if cfg.compute.device == "auto":
        OmegaConf.update(cfg, "compute.gpus_per_trial", 1 if gpus > 0 else 0)


def _parent_tags(cfg: DictConfig, path: Path) -> dict:
    import ray
    import torch

    return {
        "backend": os.environ.get(SUBMITTED_BY) or cfg.backend.name,  # vm, not the job's attach
        "workload": cfg.workload.name,
        "ray_version": ray.__version__,
        "torch_version": torch.__version__,
        "synthetic": str(bool(cfg.data.synthetic)).lower(),
        "git_commit": git_commit(cfg.workload.get("trainable")),
        "experiment_dir": str(path),
    }


def _report(cfg: DictConfig, tracker: Tracker, summary, path: Path, peak: NodePeak, workload) -> None:
    """The outcome into the parent run and onto the terminal."""
    tracker.set_tags({"device": ",".join(summary.devices) or cfg.compute.device})
    tracker.log_metrics({**summary.parent_metrics(), **peak.metrics()})
    if summary.best_checkpoint and cfg.tracking.get("log_best_checkpoint", False):
        tracker.log_artifacts(summary.best_checkpoint, "best_checkpoint")
    settle_ray_logs()  # Ray's held-back worker lines above the results, not below them
    print(summary.table(), flush=True)
    _plots(cfg, tracker, path, workload)
    print(f"experiment: {path}   (continue it with resume={path})")
    print(f"MLflow: {tracker.ui_hint()}", flush=True)


def _plots(cfg: DictConfig, tracker: Tracker, path: Path, workload) -> None:
    """The run's plots (rayflow.plots), drawn from its experiment folder now that the run is over,
    into `<path>/plots/` and the parent run's `plots/`; their place goes under the results table."""
    try:
        from rayflow.plots import FOLDER, make_plots

        files = make_plots(workload.figures(cfg, path), path)
        if files:
            tracker.log_artifacts(str(path / FOLDER), FOLDER)
    # Broad on purpose: the run itself is done; a plot (matplotlib, an odd result, the upload)
    # that fails costs the plot and one warning line, never the run's outcome.
    except Exception as err:  # noqa: BLE001
        print(f"rayflow: warning: plots: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
        return
    if files:
        where = f"; MLflow: {FOLDER}/ of the parent run {tracker.run_id}" if tracker.run_id else ""
        print(f"plots: {path / FOLDER}/ ({', '.join(f.name for f in files)}){where}", flush=True)


def _job_env(tracker: Tracker) -> dict[str, str]:
    env = {}
    if not sys.stdout.isatty():  # a pipe, a CI log, a notebook cell: Ray's log prefixes without colour codes
        env["RAY_COLOR_PREFIX"] = os.environ.get("RAY_COLOR_PREFIX", "0")
    if tracker.enabled:  # Ray nodes that Spark or Kubernetes start get it forwarded
        env["MLFLOW_TRACKING_URI"] = tracker.absolute_uri
        # MLflow's own HTTP defaults retry an unreachable server for minutes: bound them.
        for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")):
            env[key] = os.environ.get(key, value)
    return env


# Set in a submitted job's environment: the backend that submitted it, its cluster spec (redacted),
# and its start-up figures (for the job that started the cluster).
SUBMITTED_BY, SUBMITTED_SPEC, SUBMITTED_METRICS = "RAYFLOW_SUBMITTED_BY", "RAYFLOW_CLUSTER_SPEC", "RAYFLOW_CLUSTER_METRICS"


def run_submitted(cfg: DictConfig, cluster: SharedCluster, overrides: list[str]) -> RunResult:
    """Start (or reuse) the cluster, run this same command on it as a Ray Job (`backend=attach`
    there), and end with the job's outcome. The job writes MLflow, checkpoints and the table, and
    ends with its result line (rayflow.result), read here into the RunResult this returns. The
    job's driver log goes into the parent MLflow run (job/driver.log) before the cluster goes.
    The job's command line is fixed: its overrides go as its request (rayflow.remote), the key
    that signs its result line by environment (rayflow.result_channel)."""
    from rayflow.job_files import job_files, merge_runtime_env
    from rayflow.remote import FORWARDED_ENV, job_entrypoint, job_overrides, run_as_job
    from rayflow.result import returned_mlflow_run
    from rayflow.result_channel import KEY_ENV, new_key

    backend = cluster.backend
    tracker = Tracker(cfg)
    absolute = {"ray_auth_mode": str(cfg.ray_auth_mode)}
    if backend.shares_filesystem:  # else this machine's paths mean nothing there: `~` is the head's own
        absolute.update({"storage_path": str(Path(str(cfg.storage_path)).expanduser().resolve()),
                         "data.root": str(Path(str(cfg.data.root)).expanduser())})
    if tracker.enabled:
        absolute["tracking.uri"] = tracker.absolute_uri
    python = sys.executable if backend.shares_filesystem else "python"  # fake nodes run this venv
    request = {"overrides": job_overrides(overrides, absolute)}
    key = new_key()  # this submission's: only this process and the job's driver hold it
    env = {"PYTHONUNBUFFERED": "1", SUBMITTED_BY: backend.name, SUBMITTED_SPEC: cluster.spec, KEY_ENV: key,
           **{k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}}
    try:
        backend, started = cluster.acquire()
        env[SUBMITTED_METRICS] = json.dumps(backend.metrics() if started else {})
        # the user's files go with the job (their size was checked by check_config); pip lists add up
        runtime_env = merge_runtime_env(backend.job_runtime_env(), job_files(cfg, in_place=backend.shares_filesystem))
        outcome = run_as_job(backend.address, job_entrypoint(python), env, headers=backend.job_headers(),
                             runtime_env=runtime_env, on_submitted=backend.job_submitted, hidden=RESULT_MARKER,
                             request=request, verbose=cfg.get("verbose", 0))
    except (KeyboardInterrupt, SystemExit):
        code = termination_exit_code()
        if code:
            print(f"rayflow: stopped by signal {code - 128}; the job was stopped", file=sys.stderr)
            raise Terminated(code) from None
        if sys.exc_info()[0] is KeyboardInterrupt:  # Ctrl-C: the job was stopped; exit as the CLI does for a local run
            print("rayflow: interrupted; the job was stopped", file=sys.stderr)
            raise SystemExit(130) from None
        raise
    except BaseException:
        command = backend.teardown_command()
        if command:  # rayflow stops it on its way out; this is for a client that dies first
            print(f"[rayflow] should anything of the cluster outlive this process: {command}", file=sys.stderr)
        raise
    base = RunResult(str(cfg.workload.name), None, experiment_dir(cfg), tuple(overrides), redact(to_container(cfg)),
                     tracker.absolute_uri if tracker.enabled else None, tracker.experiment or None)
    # a failed job's log gives no result (its last lines are shown instead): only where its MLflow
    # parent run is, from its signed line, so its log goes there rather than into a second one
    succeeded = outcome.status == "SUCCEEDED"
    if succeeded:
        result, _ = returned_result(outcome.log, base, bytes.fromhex(key))
    else:
        result = base
        result.mlflow_experiment_id, result.mlflow_run_id = returned_mlflow_run(outcome.log, bytes.fromhex(key))
    log = without_result_line(outcome.log)
    where = _keep_driver_log(cfg, cluster.spec, tracker, result, log, outcome.job_id)
    if not succeeded:
        print_last_lines(log, outcome.job_id, where)
        raise RunFailed(f"the job on backend={backend.name} ended {outcome.status}" + (f": {outcome.error}" if outcome.error else ""))
    if result.summary is not None and result.summary.table().strip():
        first = result.summary.table().strip().splitlines()[0]
        if not any(line.strip() == first for line in outcome.streamed):  # the stream missed the job's table
            print(result.summary.table(), flush=True)
    return result


JOB_LOG = "job/driver.log"  # in the parent MLflow run: a submitted job's whole driver log
LAST_LINES = 25  # of a failed job's log, printed after it


def _keep_driver_log(cfg: DictConfig, spec: str, tracker: Tracker, result: RunResult, log: str, job_id: str) -> str | None:
    """The job's driver log into its parent MLflow run (one made here, FAILED, when the job ended
    before it made its own), so it can be read once the cluster is gone. Returns where it went.
    The log is stored masked. A tracking server that went away while the job ran costs the
    stored log and one warning line, never the run's outcome or its result."""
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    from rayflow.redaction import mask_text

    if not tracker.enabled:
        return None
    run_id = result.mlflow_run_id
    try:
        if run_id is None:  # the job failed before its run began (an import, its own preflight)
            tracker.start(cfg, spec, tags={"backend": cfg.backend.name, "workload": cfg.workload.name, "job_id": job_id})
            tracker.end("FAILED")
            run_id = result.mlflow_run_id = tracker.run_id
            result.mlflow_experiment_id = tracker.experiment_id
        tracker.client.log_text(run_id, mask_text(log), JOB_LOG)
    except (MlflowException, RequestException, OSError) as err:
        print(f"rayflow: warning: the job's log was not stored in MLflow ({mask_text(tracker.absolute_uri)}): "
              f"{type(err).__name__}: {mask_text(str(err).strip().splitlines()[0] if str(err).strip() else '')}",
              file=sys.stderr, flush=True)
        return None
    return f"MLflow run {run_id}, {JOB_LOG}"


def print_last_lines(log: str, job_id: str, where: str | None = None) -> None:
    """The last lines of a failed job's log on stderr (with where the whole log is, when kept), masked."""
    from rayflow.redaction import mask_text

    lines = log.rstrip("\n").split("\n")[-LAST_LINES:]  # "\n" only, as the channel reads it
    whole = f"; the whole log: {where}" if where else ""
    print(f"[rayflow] the last {len(lines)} lines of job {job_id}{whole}:", file=sys.stderr)
    for line in lines:
        print(f"  | {mask_text(line)}", file=sys.stderr)
    sys.stderr.flush()


def spec_text(backend: ClusterBackend) -> str:
    """The cluster spec the backend starts or joins, as YAML with secrets masked (printed, logged)."""
    return yaml.safe_dump(redact(yaml.safe_load(backend.render()) or {}), sort_keys=False)


def run_job(cfg: DictConfig, overrides: list[str], cluster: SharedCluster) -> RunResult | None:
    """One job on `cluster` (started by the first job that acquires it); its RunResult (None for
    a dry run; a run submitted as a Ray Job returns what the job sent back). `overrides`: the job's
    command line. Raises RunFailed, RunInterrupted or Terminated after its own clean-up; the
    cluster is stopped by the `with` block that holds it."""
    reset_termination()  # a signal an earlier job of this process received is not this job's
    backend, spec = cluster.backend, cluster.spec  # the jobs of a cluster share its backend config
    if cfg.dry_run:
        sys.stdout.write(spec)
        notes = backend.notes() + (literal_secrets_note(yaml.safe_load(backend.render())) if backend.name != "kuberay" else [])
        if cfg.tracking.enabled and not _local_files_ok(backend) and is_local_store(cfg.tracking.uri):
            notes.append("tracking.uri: a real run needs a tracking server (http(s)://, databricks): the cluster's nodes do not share this machine's files")
        for note in notes:
            print(note if note.startswith("rayflow:") else f"rayflow: {note}", file=sys.stderr)
        return None
    if backend.submits_jobs:
        return run_submitted(cfg, cluster, overrides)
    with claimed_experiment(cfg) as path:  # made (new) and locked while this job runs
        return _run_here(cfg, overrides, cluster, path)


def _run_here(cfg: DictConfig, overrides: list[str], cluster: SharedCluster, path: Path) -> RunResult:
    """run_job's own run in this process, in the experiment folder `path` that it holds."""
    backend, spec = cluster.backend, cluster.spec
    resuming = cfg.resume is not False  # its config is the experiment's (composition.resumed)
    workload = workload_for(cfg.workload)
    data = DataSpec.from_config(cfg.data, seed=int(cfg.seed))
    uses_data = workload.USES_DATA  # the presets cifar and ddp; the user's code brings its own
    if uses_data and data.synthetic:
        print(f"[rayflow] data: SYNTHETIC CIFAR-format set (data.synthetic=true) under {data.batch_dir}", flush=True)
    if uses_data and backend.shares_filesystem:
        prepare(data)  # same filesystem as the trials: fail on missing data before Ray starts
    tracker = Tracker(cfg)
    result = RunResult(str(cfg.workload.name), None, path, tuple(overrides), redact(to_container(cfg)),
                       tracker.absolute_uri if tracker.enabled else None, tracker.experiment or None)
    keys = sorted({bundle.keys[r] for bundle in workload.demand(cfg) for r, amount in bundle.resources.items() if amount})
    status = "FAILED"
    import ray  # noqa: F401  (its log handler exists before plain_ray_logs filters it)

    with scoped_env(_job_env(tracker)), plain_ray_logs():
        try:
            backend, started = cluster.acquire()
            _resolve_compute(cfg)
            previous = read_state(path).get("mlflow_run_id") if resuming else None
            spec = os.environ.get(SUBMITTED_SPEC) or spec  # a submitted run records the cluster it ran on
            tracker.start(cfg, spec, tags={**_parent_tags(cfg, path), **backend.tags()}, resume_run_id=previous)
            result.mlflow_run_id, result.mlflow_experiment_id = tracker.run_id, tracker.experiment_id
            if os.environ.get(SUBMITTED_METRICS):  # the start-up of the cluster that submitted this job
                tracker.log_metrics(json.loads(os.environ[SUBMITTED_METRICS]))
            elif started:
                tracker.log_metrics(backend.metrics())
            # what a resume composes again (composition.resumed): the choices and the keys, masked
            state = {"mlflow_run_id": tracker.run_id, "choices": group_choices(list(overrides)),
                     "config": {k: to_container(cfg)[k] for k in RESUMED_KEYS}}
            write_state(path, {**read_state(path), **redact(state)})  # keeps what the workload saved (resume)
            hint = f"lower {', '.join(keys)} or use a cluster with bigger nodes"
            with NodePeak() as peak, PlacementWatch(float(cfg.schedule_timeout_s), hint) as watch:
                try:
                    summary = workload.run(cfg, RunContext(tracker, data, path, resuming, _trial_slots(backend, workload, cfg)))
                except (KeyboardInterrupt, SystemExit):
                    if watch.message is None:
                        raise
            if watch.message is not None:  # the watch stopped the run; Tune and Train saved their state
                raise RunFailed(watch.message, result)
            result.summary = summary
            _report(cfg, tracker, summary, path, peak, workload)
            print(f"cluster nodes at peak: {peak.peak}", flush=True)
            if summary.interrupted:
                raise RunInterrupted(f"interrupted; state saved. Continue with: python -m rayflow resume={path}", result)
            if summary.errored:
                cause = f": {summary.error}" if summary.error else ""
                raise RunFailed(f"{summary.errored} trial(s) errored{cause}; their errors are above and in {path}. "
                                f"Continue with: python -m rayflow resume={path}", result)
            status = "FINISHED"
            return result
        except (KeyboardInterrupt, SystemExit) as stop:
            status = "KILLED"
            code = termination_exit_code()
            if code:
                print(f"rayflow: stopped by signal {code - 128}; state saved. Continue with: python -m rayflow resume={path}", file=sys.stderr)
                raise Terminated(code) from None
            if isinstance(stop, KeyboardInterrupt) and not isinstance(stop, RunInterrupted):
                raise RunInterrupted(f"interrupted; state saved. Continue with: python -m rayflow resume={path}", result) from None
            raise
        finally:
            tracker.end(status)
            if os.environ.get(SUBMITTED_BY):  # a submitted job: its result, for the side that submitted it
                emit(result_line(result, status))  # one write: Ray's log thread prints meanwhile


def _consecutive(jobs: Sequence[Job]) -> Iterator[list[Job]]:
    """The jobs in runs of consecutive ones that share a cluster (the same backend config)."""
    group: list[Job] = []
    for job in jobs:
        if group and cluster_key(job.cfg) != cluster_key(group[0].cfg):
            yield group
            group = []
        group.append(job)
    if group:
        yield group


def run_jobs(jobs: Sequence[Job]) -> list[RunResult | None]:
    """Run checked jobs in order (rayflow.composition.preflight), each cluster started once for the
    consecutive jobs that share it and stopped when they are done, or when one of them fails or
    is interrupted: then the exception goes on after the teardown, and the rest do not run."""
    results: list[RunResult | None] = []
    for group in _consecutive(jobs):
        backend = check_config(group[0].cfg)  # checked again just before it starts; sets what it preloads
        with cluster_scope(group[0].cfg, backend) as cluster:
            for job in group:
                results.append(run_job(job.cfg, job.overrides, cluster))
    return results


@contextlib.contextmanager
def cluster_scope(cfg: DictConfig, backend: ClusterBackend) -> Iterator[SharedCluster]:
    """The one cluster lifecycle, for rayflow's own jobs (run_jobs) and for the jobs of a Hydra
    app's sweep (rayflow.launcher): a cluster of `backend` (checked), started by the first
    `acquire()`, with its output kept plain, and stopped when the block ends, however it ends."""
    with _cluster_output(cfg, backend), SharedCluster(backend, spec_text(backend)) as cluster:
        yield cluster


def _cluster_output(cfg: DictConfig, backend: ClusterBackend) -> contextlib.AbstractContextManager:
    """What a cluster this process is connected to prints while it lives, its shutdown included
    (Ray flushes its workers' last deduplicated lines then): without colour codes where stdout
    is not a terminal. (A submitted run's output is the job's, streamed as it comes.)"""
    if cfg.dry_run or not backend.connects_driver:
        return contextlib.nullcontext()
    import ray  # noqa: F401  (its log handler exists before plain_ray_logs filters it)

    env = {} if sys.stdout.isatty() else {"RAY_COLOR_PREFIX": os.environ.get("RAY_COLOR_PREFIX", "0")}
    stack = contextlib.ExitStack()
    stack.enter_context(scoped_env(env))
    stack.enter_context(plain_ray_logs())
    return stack
