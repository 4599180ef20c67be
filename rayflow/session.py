"""One invocation (or one job of a multirun): check, start or reuse the cluster, run, report.

The cluster outlives a job only inside a multirun, where the jobs with the same backend
config share it; MultirunCallback (a Hydra callback, see conf/config.yaml) stops
it when the multirun ends, and atexit does if the multirun dies first.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rayflow.backends import ClusterBackend, backend_for
from rayflow.backends.base import Terminated, reset_termination, termination_exit_code
from rayflow.config import ConfigError, check_common, drop_redacted, positive_number, redact, to_container
from rayflow.data import DataSpec, prepare
from rayflow.placement import PlacementWatch, check_fits
from rayflow.tracking import Tracker, check_uri, git_commit
from rayflow.tuning import experiment_dir, read_state, write_state
from rayflow.workloads import workload_for


def check_config(cfg: DictConfig) -> ClusterBackend:
    """Every preflight check; raises ConfigError, starts nothing. Returns the backend."""
    check_common(cfg)
    positive_number(cfg, "schedule_timeout_s")
    backend = backend_for(cfg)
    backend.check()
    workload = workload_for(cfg.workload.name)
    workload.check(cfg)
    if cfg.compute.device == "cuda":
        gpus = backend.cluster_gpus()
        if gpus is not None and gpus <= 0:
            raise ConfigError("compute", f"compute=gpu but backend {backend.name} has no CUDA device; use compute=cpu or compute=auto")
    bundles = workload.demand(cfg)
    nodes = backend.capacity({k for b in bundles for k, v in b.resources.items() if v})
    if nodes is not None:  # else the running cluster is watched (PlacementWatch)
        check_fits(bundles, nodes, backend.name)
    if cfg.resume is not False:
        experiment_dir(cfg)
    check_uri(cfg)  # last: it may wait tracking.timeout_s for a server
    return backend


class ClusterPool:
    """At most one cluster at a time, kept between the jobs of a multirun."""

    def __init__(self) -> None:
        self.backend: ClusterBackend | None = None
        self.key: str | None = None

    @staticmethod
    def key_of(cfg: DictConfig) -> str:
        """What defines a cluster: its backend section and auth mode. (Not the rendered spec,
        which can describe the state a running cluster left, e.g. an active SparkSession.)"""
        return json.dumps([to_container(cfg.backend), str(cfg.ray_auth_mode)], sort_keys=True, default=str)

    def acquire(self, backend: ClusterBackend, key: str) -> tuple[ClusterBackend, bool]:
        """The cluster for this job, and whether this job started it (its start-up figures
        belong to this job's run, not to the later jobs that reuse it)."""
        if self.backend is not None and self.key == key:
            print(f"[rayflow] reusing the {backend.name} cluster at {self.backend.address}", flush=True)
            return self.backend, False
        self.release()
        print(f"[rayflow] starting the {backend.name} cluster", flush=True)
        backend.__enter__()
        self.backend, self.key = backend, key
        return backend, True

    def release(self) -> None:
        backend, self.backend, self.key = self.backend, None, None
        if backend is not None:
            backend.__exit__(None, None, None)


POOL = ClusterPool()
atexit.register(POOL.release)


class MultirunCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        POOL.release()


# Config a resumed experiment keeps from its first run, whatever the resume command says.
RESUMED_KEYS = ("workload", "data", "seed", "compute")


@dataclass
class RunContext:
    tracker: Tracker
    data: DataSpec
    experiment_dir: Path
    resume: bool


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _resolve_compute(cfg: DictConfig) -> None:
    """compute=auto: one GPU per trial when the connected cluster has GPUs, else the CPU."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if cfg.compute.device == "cuda" and gpus <= 0:
        raise ConfigError("compute", "compute=gpu but the cluster has no GPU")
    if cfg.compute.device == "auto":
        OmegaConf.update(cfg, "compute.gpus_per_trial", 1 if gpus > 0 else 0)


class NodePeak:
    """The most Ray nodes alive at once (head included), sampled each second while a job runs."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rayflow-node-peak", daemon=True)

    def _sample(self) -> None:
        import ray

        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, sum(1 for node in ray.nodes() if node["Alive"]))
            except Exception:  # the driver is disconnecting: the peak so far stands
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "NodePeak":
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _parent_tags(cfg: DictConfig, path: Path) -> dict:
    import ray
    import torch

    return {
        "backend": cfg.backend.name,
        "workload": cfg.workload.name,
        "ray_version": ray.__version__,
        "torch_version": torch.__version__,
        "synthetic": str(bool(cfg.data.synthetic)).lower(),
        "git_commit": git_commit(),
        "experiment_dir": str(path),
    }


def _report(cfg: DictConfig, tracker: Tracker, summary, path: Path, peak: NodePeak) -> None:
    """The outcome into the parent run and onto the terminal."""
    tracker.set_tags({"device": ",".join(summary.devices) or cfg.compute.device})
    tracker.log_metrics({**summary.parent_metrics(), "cluster_nodes_peak": peak.peak})
    if summary.best_checkpoint and cfg.tracking.get("log_best_checkpoint", False):
        tracker.log_artifacts(summary.best_checkpoint, "best_checkpoint")
    print(summary.table(), flush=True)
    print(f"experiment: {path}   (continue it with resume={path})")
    print(f"MLflow: {tracker.ui_hint()}", flush=True)


class RunFailed(RuntimeError):
    """The run started but could not finish: trials errored, or a demand could never be placed.
    The CLI prints the message as one line and exits 1."""


@contextlib.contextmanager
def scoped_env(values: dict[str, str]):
    """Set environment variables for one job and put back what was there (notebooks, multirun)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _job_env(tracker: Tracker) -> dict[str, str]:
    env = {}
    if tracker.enabled:  # Ray nodes that Spark or Kubernetes start get it forwarded
        env["MLFLOW_TRACKING_URI"] = tracker.absolute_uri
        # MLflow's own HTTP defaults retry an unreachable server for minutes: bound them.
        for key, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3"), ("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")):
            env[key] = os.environ.get(key, value)
    return env


def run_job(cfg: DictConfig):
    reset_termination()  # a signal an earlier job of this process received is not this job's
    backend = check_config(cfg)
    spec = yaml.safe_dump(redact(yaml.safe_load(backend.render()) or {}), sort_keys=False)  # printed and logged
    if cfg.dry_run:
        sys.stdout.write(spec)
        return None

    path = experiment_dir(cfg)
    resuming = cfg.resume is not False
    if resuming:  # what trials run is the experiment's, not the resume command line's
        saved = read_state(path).get("config", {})
        for key, value in saved.items():  # masked secrets keep the value given now
            OmegaConf.update(cfg, key, drop_redacted(value), merge=True)
    workload = workload_for(cfg.workload.name)
    data = DataSpec.from_config(cfg.data, seed=int(cfg.seed))
    uses_data = getattr(workload, "USES_DATA", True)  # ppo makes its own
    if uses_data and data.synthetic:
        print(f"[rayflow] data: SYNTHETIC CIFAR-format set (data.synthetic=true) under {data.batch_dir}", flush=True)
    if uses_data and backend.shares_filesystem:
        prepare(data)  # same filesystem as the trials: fail on missing data before Ray starts
    tracker = Tracker(cfg)
    keys = sorted({bundle.keys[r] for bundle in workload.demand(cfg) for r, amount in bundle.resources.items() if amount})
    status = "FAILED"
    with scoped_env(_job_env(tracker)):
        try:
            backend, started = POOL.acquire(backend, ClusterPool.key_of(cfg))
            _resolve_compute(cfg)
            previous = read_state(path).get("mlflow_run_id") if resuming else None
            tracker.start(cfg, spec, tags={**_parent_tags(cfg, path), **backend.tags()}, resume_run_id=previous)
            if started:
                tracker.log_metrics(backend.metrics())
            state = {"mlflow_run_id": tracker.run_id, "config": {k: to_container(cfg)[k] for k in RESUMED_KEYS}}
            write_state(path, {**read_state(path), **redact(state)})  # keeps what the workload saved (resume)
            hint = f"lower {', '.join(keys)} or use a cluster with bigger nodes"
            with NodePeak() as peak, PlacementWatch(float(cfg.schedule_timeout_s), hint) as watch:
                try:
                    summary = workload.run(cfg, RunContext(tracker, data, path, resuming))
                except (KeyboardInterrupt, SystemExit):
                    if watch.message is None:
                        raise
            if watch.message is not None:  # the watch stopped the run; Tune and Train saved their state
                raise RunFailed(watch.message)
            _report(cfg, tracker, summary, path, peak)
            print(f"cluster nodes at peak: {peak.peak}", flush=True)
            if summary.interrupted:
                print(f"rayflow: interrupted; state saved. Continue with: python -m rayflow resume={path}", file=sys.stderr)
                sys.exit(130)
            if summary.errored:
                raise RunFailed(f"{summary.errored} trial(s) errored; their errors are above and in {path}. Continue with: python -m rayflow resume={path}")
            status = "FINISHED"
            return summary
        except (KeyboardInterrupt, SystemExit):
            status = "KILLED"
            code = termination_exit_code()
            if code:
                print(f"rayflow: stopped by signal {code - 128}; state saved. Continue with: python -m rayflow resume={path}", file=sys.stderr)
                raise Terminated(code) from None
            raise
        finally:
            tracker.end(status)
            if not _in_multirun() or sys.exc_info()[0] is not None:
                POOL.release()
