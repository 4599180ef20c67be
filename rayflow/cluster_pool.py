"""The cluster of the jobs of one invocation: at most one at a time, kept between the jobs of a
multirun whose backend config is the same, stopped by MultirunCallback (a Hydra callback, see
conf/config.yaml) when the multirun ends, and by atexit if it dies first."""

from __future__ import annotations

import atexit
import json

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rayflow.backends import ClusterBackend
from rayflow.config import mask_text, to_container


class ClusterPool:
    """At most one cluster at a time, kept between the jobs of a multirun."""

    def __init__(self) -> None:
        self.backend: ClusterBackend | None = None
        self.key: str | None = None
        self.spec: str | None = None  # the spec the kept cluster was started from

    def holds(self, key: str) -> bool:
        """Whether the next job with this key reuses the kept cluster (and must not render a new
        spec: rendering Spark's asks the session's executors, which the kept cluster occupies)."""
        return self.backend is not None and self.key == key

    @staticmethod
    def key_of(cfg: DictConfig) -> str:
        """What defines a cluster: its backend section and auth mode. (Not the rendered spec,
        which can describe the state a running cluster left, e.g. an active SparkSession.)"""
        return json.dumps([to_container(cfg.backend), str(cfg.ray_auth_mode)], sort_keys=True, default=str)

    def acquire(self, backend: ClusterBackend, key: str, spec: str | None = None) -> tuple[ClusterBackend, bool]:
        """The cluster for this job, and whether this job started it (its start-up figures
        belong to this job's run, not to the later jobs that reuse it)."""
        if self.backend is not None and self.key == key:
            print(f"[rayflow] reusing the {backend.name} cluster at {mask_text(str(self.backend.address))}", flush=True)
            return self.backend, False
        self.release()
        print(f"[rayflow] starting the {backend.name} cluster", flush=True)
        backend.__enter__()
        self.backend, self.key, self.spec = backend, key, spec
        return backend, True

    def release(self) -> None:
        backend, self.backend, self.key, self.spec = self.backend, None, None, None
        if backend is not None:
            backend.__exit__(None, None, None)


POOL = ClusterPool()
atexit.register(POOL.release)


class MultirunCallback(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        POOL.release()
