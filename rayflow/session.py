"""One invocation (or one job of a multirun): check, start or reuse the cluster, run, report.

The cluster outlives a job only inside a multirun, where the jobs with the same backend
config share it; MultirunCallback (a Hydra callback, see conf/config.yaml) stops
it when the multirun ends, and atexit does if the multirun dies first.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rayflow.backends import ClusterBackend, backend_for
from rayflow.backends.base import Terminated, termination_exit_code
from rayflow.config import ConfigError, check_common, drop_redacted, redact, to_container
from rayflow.data import DataSpec, prepare
from rayflow.tracking import Tracker, git_commit
from rayflow.tuning import experiment_dir, read_state, write_state
from rayflow.workloads import workload_for


def check_config(cfg: DictConfig) -> ClusterBackend:
    """Every preflight check; raises ConfigError, starts nothing. Returns the backend."""
    check_common(cfg)
    backend = backend_for(cfg)
    backend.check()
    workload_for(cfg.workload.name).check(cfg)
    if cfg.compute.device == "cuda":
        gpus = backend.cluster_gpus()
        if gpus is not None and gpus <= 0:
            raise ConfigError("compute", f"compute=gpu but backend {backend.name} has no CUDA device; use compute=cpu or compute=auto")
    if cfg.resume is not False:
        experiment_dir(cfg)
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
        return json.dumps([to_container(cfg)["backend"], str(cfg.ray_auth_mode)], sort_keys=True, default=str)

    def acquire(self, backend: ClusterBackend, key: str) -> ClusterBackend:
        if self.backend is not None and self.key == key:
            print(f"[rayflow] reusing the {backend.name} cluster at {self.backend.address}", flush=True)
            return self.backend
        self.release()
        print(f"[rayflow] starting the {backend.name} cluster", flush=True)
        backend.__enter__()
        self.backend, self.key = backend, key
        return backend

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


def run_job(cfg: DictConfig):
    backend = check_config(cfg)
    spec = backend.render()
    if cfg.dry_run:
        sys.stdout.write(spec)
        return None

    path = experiment_dir(cfg)
    resuming = cfg.resume is not False
    if resuming:  # what trials run is the experiment's, not the resume command line's
        saved = read_state(path).get("config", {})
        for key, value in saved.items():  # masked secrets keep the value given now
            OmegaConf.update(cfg, key, drop_redacted(value), merge=True)
    data = DataSpec.from_config(cfg.data, seed=int(cfg.seed))
    uses_data = getattr(workload_for(cfg.workload.name), "USES_DATA", True)  # ppo makes its own
    if uses_data and data.synthetic:
        print(f"[rayflow] data: SYNTHETIC CIFAR-format set (data.synthetic=true) under {data.batch_dir}", flush=True)
    if uses_data and cfg.backend.name == "local":
        prepare(data)  # same filesystem as the trials: fail on missing data before Ray starts
    tracker = Tracker(cfg)
    if tracker.enabled:  # Ray nodes that Spark or Kubernetes start get it forwarded
        os.environ["MLFLOW_TRACKING_URI"] = tracker.absolute_uri
    status = "FAILED"
    try:
        POOL.acquire(backend, ClusterPool.key_of(cfg))
        _resolve_compute(cfg)
        previous = read_state(path).get("mlflow_run_id") if resuming else None
        backend = POOL.backend
        tracker.start(cfg, spec, tags={**_parent_tags(cfg, path), **backend.tags()}, resume_run_id=previous)
        tracker.log_metrics(backend.metrics())
        state = {"mlflow_run_id": tracker.run_id, "config": {k: to_container(cfg)[k] for k in RESUMED_KEYS}}
        write_state(path, {**read_state(path), **redact(state)})  # keeps what the workload saved (resume)
        with NodePeak() as peak:
            summary = workload_for(cfg.workload.name).run(cfg, RunContext(tracker, data, path, resuming))
        _report(cfg, tracker, summary, path, peak)
        print(f"cluster nodes at peak: {peak.peak}", flush=True)
        if summary.interrupted:
            print(f"rayflow: interrupted; state saved. Continue with: python -m rayflow resume={path}", file=sys.stderr)
            sys.exit(130)
        status = "FINISHED" if summary.errored == 0 else "FAILED"
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
