"""A running cluster, as a backend's `start()` leaves it: the `ClusterHandle` the orchestrator
passes along (like SkyPilot's resource handles), so that a backend object holds its config and
nothing of any one cluster's life.

A handle holds what a caller needs to use the cluster (its address; for a cluster that runs the job
itself, how to submit it: `Submission`), to tear it down (the undo steps its start registered, and a
command that does it should this process die first) and to report on it (timings, tags, metrics).
`record()` is its lasting part, plain data: what a later command (`status`, `down`, autostop) can
keep and act on once this process is gone. The undo steps are this process's only.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rayflow.security.redaction import mask_text


@dataclass
class Submission:
    """How a job reaches a cluster that runs it (the backends that submit: vm, kuberay)."""

    # every request to its Jobs API (a token only it holds)
    headers: dict[str, str] = field(default_factory=dict)
    # more of the job's runtime_env (pip packages)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    # told the job's id once it exists (a KubeRay RayJob)
    on_submitted: Callable[[str], None] | None = None
    # its nodes share this machine's files: the job's folders are used where they are
    in_place: bool = False
    # the interpreter that runs the job there (this one, where the nodes are this machine)
    python: str = "python"
    # environment variables of this side the job is not handed: its nodes have an identity of
    # their own (aws: the instance profile of Ray's bootstrap role), so no keys are copied there
    withheld: tuple[str, ...] = ()


@dataclass
class ClusterHandle:
    """One cluster a backend started or joined, while this process uses it: how to reach it, how
    to stop what its start left, what to report of it. Its `record()` is the part that outlives
    this process."""

    backend: str  # the backend that started or joined it
    # the driver's address, or the dashboard URL of a cluster that runs jobs itself
    address: str = ""
    name: str | None = None  # its own name, where it has one (a vm cluster name, a RayCluster)
    # the id this start gave itself: what it made carries it (a vm name's claim, a label)
    owner_run: str | None = None
    submission: Submission | None = None  # for a cluster the run is submitted to
    # what stops what start() left, should this process die first
    teardown_command: str | None = None
    # left running when the run ends (backend.keep_cluster), for a later run to join
    kept: bool = False
    joined: bool = False  # kept by an earlier run, and joined by this one
    # what a later command needs to reach and stop it (a kept cluster's record,
    # rayflow.backends.kept): paths and object names, never a secret
    where: dict[str, str] = field(default_factory=dict)
    # how the watcher that runs on the cluster stops it once idle (rayflow.autostop); None
    # where this backend's clusters cannot stop themselves
    autostop: dict[str, str] | None = None
    # when start() began (seconds since the epoch)
    started_at: float = field(default_factory=time.time)
    start_seconds: float | None = None  # how long start() took
    # for the MLflow parent run of the job that started it
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # start-up figures (seconds), likewise
    # the undo steps that failed, one line each
    teardown_errors: list[str] = field(default_factory=list)
    _undo: contextlib.ExitStack = field(default_factory=contextlib.ExitStack, repr=False)

    def on_stop(self, what: str, undo: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Register `undo(*args, **kwargs)`, described by `what`, to run when the cluster stops:
        call it the moment the step it undoes has succeeded."""
        self._undo.callback(self._guarded, what, undo, args, kwargs)

    def _guarded(
        self, what: str, undo: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        try:
            undo(*args, **kwargs)
        # A teardown step that fails, whatever the reason, must not keep the others from running.
        except Exception as err:  # noqa: BLE001
            text = str(err)
            message = (
                f"{what}: {type(err).__name__}: {mask_text(text).splitlines()[0] if text else ''}"
            )
            self.teardown_errors.append(message)
            print(
                f"rayflow: warning: teardown step failed, going on: {message}",
                file=sys.stderr,
                flush=True,
            )

    def unwind(self) -> None:
        """Run every registered undo step, newest first, past any that fails. Idempotent."""
        self._undo.close()

    @contextlib.contextmanager
    def unwound_on_error(self) -> Iterator[ClusterHandle]:
        """A start in progress: whatever it raises, what it had started is stopped first."""
        try:
            yield self
        except BaseException:
            self.unwind()
            raise

    def record(self) -> dict[str, Any]:
        """What outlives this process: plain data, no secret (headers and undo steps stay here)."""
        return {
            "backend": self.backend,
            "name": self.name,
            "owner_run": self.owner_run,
            "address": mask_text(self.address),
            "kept": self.kept,
            "started_at": self.started_at,
            "teardown_command": self.teardown_command,
            "where": dict(self.where),
        }
