"""A cluster's lifetime, in one place: started by the first job that needs it, stopped when the
`with` block that holds it ends, however it ends (done, an error, Ctrl-C, SIGTERM or SIGHUP).

`running(backend)` is one cluster's life: the auth mode exported, the terminating signals turned
into exceptions while it lives (rayflow.runtime.signals), `backend.start()`, and
`backend.stop(handle)` at the end. `SharedCluster` holds it for the consecutive jobs that share one
(rayflow's own jobs, rayflow.orchestrator.session, and a Hydra app's sweeps, rayflow.launcher),
started by the first `acquire()`. There is no global cluster: `rayflow.launcher.keep_clusters()`
keeps clusters in a block of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator

from omegaconf import DictConfig

from rayflow.backends import ClusterBackend, ClusterHandle, WorkerPreload
from rayflow.runtime.environment import apply_auth_mode, scoped_env
from rayflow.runtime.signals import terminations_raise
from rayflow.schema.values import to_container
from rayflow.security.redaction import mask_text, redact


def cluster_key(cfg: DictConfig) -> str:
    """What defines a cluster: its backend section and auth mode. (Not the rendered spec,
    which can describe the state a running cluster left, e.g. an active SparkSession.)"""
    return json.dumps(
        [to_container(cfg.backend), str(cfg.ray_auth_mode)], sort_keys=True, default=str
    )


def spec_text(backend: ClusterBackend, preload: WorkerPreload | None = None) -> str:
    """The cluster spec the backend starts or joins, as YAML, secrets masked (printed, logged):
    one document, or several where the backend applies more than one object (a RayCluster and
    what lets it stop itself)."""
    import yaml

    documents = [redact(d or {}) for d in yaml.safe_load_all(backend.render(preload).text)]
    return yaml.safe_dump_all(documents or [{}], sort_keys=False)


@contextlib.contextmanager
def running(
    backend: ClusterBackend, preload: WorkerPreload | None = None
) -> Iterator[ClusterHandle]:
    """The cluster `backend` starts (or joins), for as long as the block runs; stopped at its end.
    SIGTERM and SIGHUP raise `Terminated` meanwhile, so every teardown's `finally` runs."""
    apply_auth_mode(backend.auth_mode)  # driver, cluster and workers agree
    with terminations_raise() as terminations:
        started = time.monotonic()
        handle = backend.start(preload)  # a start that fails stops what it had started, then raises
        handle.start_seconds = time.monotonic() - started
        handle.metrics.setdefault("cluster_start_s", handle.start_seconds)
        # its autostop armed, a kept one recorded (nothing for a cluster neither kept nor
        # autostopped; a cluster kept in this process, spark's, has its idle timer there)
        from rayflow.orchestrator.clusters import kept_started

        with handle.unwound_on_error():
            kept_started(backend, handle)
        # ray.init installs a C++ SIGTERM handler that aborts the driver without clean-up: take
        # the signal back
        terminations.catch()
        try:
            yield handle
        finally:
            backend.stop(handle)


class SharedCluster:
    """One backend's cluster for the jobs of one `with` block. `spec` is what it was rendered from,
    rendered once: the next job reuses it instead of rendering again (rendering Spark's asks the
    session's executors, which a running Ray-on-Spark cluster occupies)."""

    def __init__(
        self, backend: ClusterBackend, spec: str, preload: WorkerPreload | None = None
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.preload = preload
        self.handle: ClusterHandle | None = None
        self._life = contextlib.ExitStack()

    def acquire(self) -> tuple[ClusterHandle, bool]:
        """The running cluster, and whether this call started it (its start-up figures belong to
        the job that started it, not to the later jobs that reuse it)."""
        if self.handle is not None:
            print(
                f"[rayflow] reusing the {self.backend.name} cluster at "
                f"{mask_text(self.handle.address)}",
                flush=True,
            )
            return self.handle, False
        if (
            self.backend.traits.joins_running
        ):  # attach, and a submitted job on its own cluster's head
            print(f"[rayflow] connecting to the running cluster ({self.backend.name})", flush=True)
        else:
            print(f"[rayflow] starting the {self.backend.name} cluster", flush=True)
        self.handle = self._life.enter_context(running(self.backend, self.preload))
        return self.handle, True

    def release(self) -> None:
        """Stop what was started (idempotent)."""
        self.handle = None
        self._life.close()

    def __enter__(self) -> SharedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def cluster_scope(
    backend: ClusterBackend, preload: WorkerPreload | None = None, dry_run: bool = False
) -> Iterator[SharedCluster]:
    """The one cluster lifecycle, for rayflow's own jobs (rayflow.orchestrator.session) and for the
    jobs of a Hydra app's sweep (rayflow.launcher): a cluster of `backend` (checked), started by the
    first `acquire()`, with its output kept plain, and stopped when the block ends, however it
    ends."""
    with (
        _cluster_output(backend, dry_run),
        SharedCluster(backend, spec_text(backend, preload), preload) as cluster,
    ):
        yield cluster


@contextlib.contextmanager
def _cluster_output(backend: ClusterBackend, dry_run: bool) -> Iterator[None]:
    """What a cluster this process is connected to prints while it lives, its shutdown included
    (Ray flushes its workers' last deduplicated lines then): without colour codes where stdout
    is not a terminal. (A submitted run's output is the job's, streamed as it comes.)"""
    if dry_run or backend.traits.submits_jobs:
        yield
        return
    import ray  # noqa: F401  (its log handler exists before plain_ray_logs filters it)

    from rayflow.runtime.ray_logs import plain_ray_logs

    colour = (
        {} if sys.stdout.isatty() else {"RAY_COLOR_PREFIX": os.environ.get("RAY_COLOR_PREFIX", "0")}
    )
    with scoped_env(colour), plain_ray_logs():
        yield
