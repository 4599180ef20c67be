"""The cluster of consecutive jobs that share one: started by the first job that needs it,
stopped when the `with` block that holds it ends (session.run_jobs), however it ends."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from rayflow.backends import ClusterBackend
from rayflow.config import to_container
from rayflow.redaction import mask_text


def cluster_key(cfg: DictConfig) -> str:
    """What defines a cluster: its backend section and auth mode. (Not the rendered spec,
    which can describe the state a running cluster left, e.g. an active SparkSession.)"""
    return json.dumps([to_container(cfg.backend), str(cfg.ray_auth_mode)], sort_keys=True, default=str)


class SharedCluster:
    """One backend's cluster for the jobs of one `with` block. `spec` is the spec it was rendered
    from, rendered once: the next job reuses it instead of rendering again (rendering Spark's asks
    the session's executors, which a running Ray-on-Spark cluster occupies)."""

    def __init__(self, backend: ClusterBackend, spec: str) -> None:
        self.backend = backend
        self.spec = spec
        self.started = False

    def acquire(self) -> tuple[ClusterBackend, bool]:
        """The running cluster, and whether this call started it (its start-up figures belong to
        the job that started it, not to the later jobs that reuse it)."""
        if self.started:
            print(f"[rayflow] reusing the {self.backend.name} cluster at {mask_text(str(self.backend.address))}", flush=True)
            return self.backend, False
        print(f"[rayflow] starting the {self.backend.name} cluster", flush=True)
        self.backend.__enter__()  # a start that fails stops what it had started, then raises
        self.started = True
        return self.backend, True

    def release(self) -> None:
        """Stop what was started (idempotent: the backend's undo stack is unwound once)."""
        if self.started:
            self.started = False
            self.backend.__exit__(None, None, None)

    def __enter__(self) -> "SharedCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
