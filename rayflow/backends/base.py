"""The contract every backend implements, shaped like Hydra's launcher plugins: an abstract class of
few members, heavy imports (ray, pyspark, kubernetes) inside them.

A backend is built from its own `backend:` config section and the run's auth mode, nothing else (as
Hydra hands a launcher only its own config), and keeps only that: what one cluster does while it
lives is in the `ClusterHandle` its `start()` returns (rayflow.backends.handle). Callers ask what a
backend does (its `traits`: `submits_jobs`, `shares_filesystem`, `single_machine`) and what it can
(a capability such as `KeepsClusters`), never what it is called.

Each step of `start()` that leaves something behind registers its undo on the handle the moment it
succeeds (`handle.on_stop`); a start that fails unwinds what it had started before it raises
(`handle.unwound_on_error()`). `stop(handle)` unwinds the rest, newest first, past a step that
fails, and may be called any number of times. The cluster's lifetime, with the signals that must
not cut it short, is rayflow.orchestrator.cluster's.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from rayflow.backends.handle import ClusterHandle
from rayflow.backends.kept import KeptCluster


@dataclass(frozen=True)
class Rendered:
    """What a backend starts or joins: `text`, the engine's own YAML document (what `ray up`,
    `kubectl apply` or `setup_ray_cluster` takes; a dry run prints it, MLflow keeps it), and
    `notes`, the lines a dry run prints under it on stderr (what is left for the user to fill in),
    worked out only when asked (Spark's sizing plan runs a task on an active session). Each literal
    secret the document holds is named among them where `secrets_noted`; else the dry run names
    them, with the environment or file alternative."""

    text: str
    explain: Callable[[], Sequence[str]] = tuple
    secrets_noted: bool = False

    @property
    def notes(self) -> list[str]:
        return list(self.explain())


@dataclass(frozen=True)
class WorkerPreload:
    """What the workload's trial processes import first (torch, RLlib), how many processes the
    trials that run at once have, and the CPUs one of them reserves (its compute threads). A
    backend that starts Ray's worker processes ahead of use has them import these, so the first
    trials do not wait for their imports."""

    modules: tuple[str, ...]
    processes: int = 1
    threads: int = 1


@dataclass(frozen=True)
class Traits:
    """What a backend does that shapes a run: its callers ask these, never its name."""

    # The one choice that shapes a run: False, this process connects to the cluster (ray.init)
    # and runs the job as its driver; True, the job goes to the cluster as a Ray Job (vm, kuberay).
    submits_jobs: bool = False
    # Its nodes see this machine's files (data prepared here, SQLite).
    shares_filesystem: bool = False
    # Its nodes are processes of one machine (this one, or the head's): a folder there is every
    # node's, so Tune's checkpoints may go to one; else storage_path must be an object store or a
    # folder every node mounts (rayflow.orchestrator.preflight.check_storage).
    single_machine: bool = False
    # It starts no cluster: it connects to one that runs already (attach), so a run says so.
    joins_running: bool = False


class ClusterBackend(abc.ABC):
    # What it does that shapes a run (a property where the config decides: a vm provider, a Spark
    # master, an attach address).
    traits: Traits = Traits()

    def __init__(self, section: DictConfig, auth_mode: str = "token") -> None:
        self.section = section  # the `backend:` config section
        self.auth_mode = str(auth_mode)

    @property
    def name(self) -> str:
        return str(self.section.name)

    # A default, not abstract: a backend with nothing to check before it starts keeps this no-op.
    def check(self) -> None:  # noqa: B027
        """Preflight: raise ConfigError for bad `backend.*` keys; must start and change nothing."""

    # Likewise: most backends have nothing only the network can tell.
    def probe(self) -> None:  # noqa: B027
        """Preflight, after check() and never in a dry run: what only an API can tell and would
        fail the start (a cloud account); raise ConfigError naming the key. Starts nothing."""

    @abc.abstractmethod
    def render(self, preload: WorkerPreload | None = None) -> Rendered:
        """What `start(preload)` would start or join (Rendered); starts nothing."""

    def capacity(self, resources: set[str]) -> list[dict[str, float]] | None:
        """The nodes the cluster can have at most, as Ray resources (at least the `resources`
        named), when known before it starts; None when only the running cluster knows (an existing
        or autoscaling one)."""
        return None

    @abc.abstractmethod
    def start(self, preload: WorkerPreload | None = None) -> ClusterHandle:
        """Start (or join) the cluster; this process left connected to it unless `submits_jobs`."""

    def stop(self, handle: ClusterHandle) -> None:
        """Stop what `start()` left of the cluster behind `handle`, and only that. Idempotent."""
        handle.unwind()


class KeepsClusters(abc.ABC):
    """The kept-cluster capability, beside the contract (as fsspec's filesystems add what they
    support): a backend that can leave its cluster running for later runs (backend.keep_cluster)
    and act on it again from its record alone (rayflow status, down, logs). Callers ask
    `isinstance(backend, KeepsClusters)`, never a backend's name."""

    @abc.abstractmethod
    def reach(self, kept: KeptCluster, headers: dict[str, str]) -> ClusterHandle | None:
        """A handle on the kept cluster of `kept` for its Jobs API (`headers`: what its requests
        carry; its undo steps close what reaching it opened), or None when the cluster is gone.
        Starts and changes nothing."""

    @abc.abstractmethod
    def down(self, kept: KeptCluster) -> None:
        """Tear down the kept cluster of `kept`: what the run that kept it started, and only
        that. Idempotent."""
