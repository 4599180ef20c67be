"""The interface every backend implements, shaped like Hydra's launcher plugins.

A backend turns its own `backend:` config section (and the run's auth mode; nothing else,
as Hydra hands a launcher only its own config) into a running Ray cluster and back:
`render` says what it would start (YAML the engine takes), `start` starts or joins it and returns its
address. Each step of `start` that leaves something behind registers its undo with
`on_stop` the moment it succeeds; `stop` runs the undo steps in reverse, goes on past one
that fails (reporting it), and may be called any number of times. Used as a context
manager a backend always stops what it started: on success, on an exception, on Ctrl-C
and on SIGTERM/SIGHUP (turned into SystemExit so `finally` blocks run). Heavy imports
(ray, pyspark, kubernetes) belong inside the methods.
"""

from __future__ import annotations

import abc
import contextlib
import signal
import sys
import threading
import time
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from rayflow.process_state import TERMINATING, apply_auth_mode, raise_terminated
from rayflow.redaction import mask_text


class ClusterBackend(abc.ABC):
    # What a backend can do; callers ask these, never the backend's name.
    connects_driver: bool = True  # start() leaves this process connected (ray.init) to the cluster
    shares_filesystem: bool = False  # its nodes see this machine's files (data prepared here, SQLite)
    owns_cluster: bool = True  # start() starts a cluster, and stop() stops it
    submits_jobs: bool = False  # the run goes to the cluster as a Ray Job (rayflow.remote)

    def __init__(self, section: DictConfig, auth_mode: str = "token"):
        self.section = section  # the `backend:` config section
        self.auth_mode = str(auth_mode)
        self.root = OmegaConf.create({"backend": section})  # so checks name keys as backend.*
        self.address: str | None = None
        self.start_seconds: float | None = None  # how long start() took, for the job that called it
        self.teardown_errors: list[str] = []
        self._undo = contextlib.ExitStack()
        self._old_handlers: dict[int, Any] = {}

    @property
    def name(self) -> str:
        return str(self.section.name)

    def check(self) -> None:
        """Preflight: raise ConfigError for bad `backend.*` keys; must start nothing."""

    def tags(self) -> dict:
        """Tags for the invocation's MLflow parent run (beyond the spec)."""
        return {}

    def metrics(self) -> dict:
        """Start-up figures (seconds) of the start() that this backend object last ran."""
        return {"cluster_start_s": self.start_seconds} if self.start_seconds is not None else {}

    def notes(self) -> list[str]:
        """Lines a dry run prints under the spec (to stderr): what is left for the user to fill in."""
        return []

    def teardown_command(self) -> str | None:
        """A command that stops what start() left, should this process die before stop() runs."""
        return None

    # For backends that submit the run (submits_jobs): what the Jobs client and the job need.
    def job_headers(self) -> dict[str, str]:
        """Headers for every request to the Jobs API (a token only this backend holds)."""
        return {}

    def job_runtime_env(self) -> dict:
        """More of the job's runtime_env (pip packages the cluster's image lacks)."""
        return {}

    def job_submitted(self, job_id: str) -> None:
        """Called once the job exists (a KubeRay RayJob is told its job id)."""

    def preload_worker_imports(self, modules: tuple[str, ...], processes: int, threads: int = 1) -> None:
        """Modules the workload's trial processes import first (torch, RLlib), how many
        processes one trial has, and the CPUs one of them reserves (its compute threads). A backend that starts Ray's worker processes ahead of use has
        them imported there, so the first trial does not wait seconds for its imports; the
        others ignore this."""

    def cluster_gpus(self) -> float | None:
        """GPUs the cluster would offer, when known before it starts (None: ask it later)."""
        return None

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        """The nodes the cluster can have at most, as Ray resources ({"CPU": 2, "GPU": 0,
        "memory": bytes}; at least the `resources` named), when known before it starts;
        None when only the running cluster knows (an existing or autoscaling one)."""
        return None

    @abc.abstractmethod
    def render(self) -> str:
        """What this backend starts or joins, as YAML text: the engine's own document where it
        has one (what `ray up`, `kubectl apply` or `setup_ray_cluster` takes), nothing else;
        notes for the user belong in notes(). A dry run prints it; MLflow keeps it."""

    @abc.abstractmethod
    def start(self) -> str:
        """Start (or join) the cluster, connect this driver to it, return its address.
        Register the undo of every step with on_stop() as soon as the step succeeds."""

    def on_stop(self, what: str, undo: Callable, *args: Any, **kwargs: Any) -> None:
        """Register `undo(*args, **kwargs)`, described by `what`, to run at stop()."""
        self._undo.callback(self._guarded, what, undo, args, kwargs)

    def _guarded(self, what: str, undo: Callable, args: tuple, kwargs: dict) -> None:
        try:
            undo(*args, **kwargs)
        except Exception as err:  # a teardown step that fails must not keep the others from running
            message = f"{what}: {type(err).__name__}: {mask_text(str(err)).splitlines()[0] if str(err) else ''}"
            self.teardown_errors.append(message)
            print(f"rayflow: warning: teardown step failed, going on: {message}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        """Run every registered undo step, newest first. Idempotent."""
        self._undo.close()

    def _catch_termination(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in TERMINATING:
                previous = signal.signal(sig, raise_terminated)
                self._old_handlers.setdefault(sig, previous)

    def __enter__(self) -> "ClusterBackend":
        apply_auth_mode(self.auth_mode)  # driver, cluster and workers agree
        self._catch_termination()
        self._undo = contextlib.ExitStack()
        started = time.monotonic()
        try:
            self.address = self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.start_seconds = time.monotonic() - started
        # ray.init installs a C++ SIGTERM handler that aborts the driver without cleanup:
        # take the signal back so SIGTERM unwinds through finally blocks and stop().
        self._catch_termination()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            self.stop()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
