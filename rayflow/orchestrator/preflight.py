"""The preflight: every check of every job of a command line, before the first one starts, run once.

`preflight(overrides, multirun)` composes each job (every point of a `-m` sweep; a resume composes
the experiment's own config: rayflow.orchestrator.resume) and checks it whole: every key against its
kind and the rules between keys (rayflow.schema), then what needs the machine or the cluster's
description: the backend's own checks, the workload's, its demand against the cluster's nodes, the
experiment to resume, the tracking store (network probes included, once). Bad input anywhere is one
ConfigError naming the key, with nothing started. It changes nothing: what it found out is the
`Plan` of each job, which the run consumes (the backend, the workload, its resource bundles, what
the cluster may preload for it, a resume's experiment with its state: located and read once).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from rayflow.backends import ClusterBackend, WorkerPreload, backend_for
from rayflow.errors import ConfigError
from rayflow.orchestrator.compose import compose_config, config_errors, sweep_points, validate
from rayflow.orchestrator.resume import resumed
from rayflow.orchestrator.submission import OnHead
from rayflow.orchestrator.upload_check import check_upload
from rayflow.results.experiment import Resumed, located, resumed_folder
from rayflow.runtime.placement import Bundle, check_fits, copies_at_once
from rayflow.tracking.tracker import check_uri, missing_run
from rayflow.workloads import workload_for
from rayflow.workloads.user_code import is_given


@dataclass
class Plan:
    """One job as the preflight found it: what the run consumes, checked."""

    overrides: list[str]  # the job's command line (a resume's: the experiment's choices first)
    cfg: DictConfig  # composed, checked, and (a resume) the experiment's own again
    backend: ClusterBackend  # built from cfg's backend section; nothing started yet
    workload: Any  # the workload's module (rayflow.workloads.Workload)
    bundles: list[Bundle]  # what one trial or run needs at once
    preload: WorkerPreload | None  # what a backend that starts workers ahead of use has them import
    trial_slots: int | None = (
        None  # trials of the one bundle the cluster holds at once; None: unknown
    )
    # package folders a submitted run's job takes besides its own files (runtime_env py_modules):
    # what hydra/sweeper=rayflow ships its search in (rayflow.sweeper.shipping)
    shipped: tuple[str, ...] = ()
    # a submitted run's job on the head: what its submitter said (None: a run started here)
    on_head: OnHead | None = None
    # a resume's experiment, located and its state read once, here (None: a new experiment)
    resumed: Resumed | None = None


def local_files_ok(backend: ClusterBackend) -> bool:
    """Whether MLflow can write a file on this machine: this process writes it, or the nodes
    share it."""
    return not backend.traits.submits_jobs or backend.traits.shares_filesystem


def check_backend(cfg: DictConfig) -> ClusterBackend:
    """The checks of the cluster a config describes: every key against the schema, then the
    backend's own check(); starts nothing. Returns the backend."""
    backend = backend_for(cfg)
    validate(cfg, local_paths=local_files_ok(backend))
    backend.check()
    return backend


def plan_job(
    cfg: DictConfig,
    overrides: list[str],
    on_head: OnHead | None = None,
    found: Resumed | None = None,
) -> Plan:
    """Every check of one job (ConfigError on the first that fails); starts and changes nothing.
    `found`: a resume's experiment as composing it located it (else located here)."""
    backend = check_backend(cfg)
    if backend.traits.submits_jobs:
        _no_python_objects(cfg, backend)
    workload = workload_for(cfg.workload)
    workload.check(cfg)
    bundles = list(workload.demand(cfg))
    nodes = backend.capacity({k for b in bundles for k, v in b.resources.items() if v} | _gpu(cfg))
    _check_gpus(cfg, backend, nodes)
    if nodes is not None:  # else the running cluster is watched (PlacementWatch)
        check_fits(bundles, nodes, backend.name)
    if cfg.resume is not False:
        found = located(cfg, found)
    # the files that go with the job fit Ray's upload limit
    if backend.traits.submits_jobs and not cfg.dry_run:
        check_upload(cfg, in_place=backend.traits.shares_filesystem)
    # last: it may wait tracking.timeout_s for a server. A run submitted to nodes that do not
    # share this machine's files cannot write a local SQLite or file store.
    # A dry run only notes it (a provider's defaults alone still render).
    check_uri(cfg, local_files_ok=local_files_ok(backend) or bool(cfg.dry_run))
    check_storage(cfg, backend, on_head)  # may wait storage.PROBE_TIMEOUT_S for an object store
    if not cfg.dry_run:
        backend.probe()  # a cloud account, within a bounded wait
    if found is not None and cfg.tracking.enabled:
        _check_resumed_run(cfg, found)
    slots = _slots(bundles, nodes)
    preload = _preload(workload, cfg, bundles, slots)
    return Plan(
        overrides, cfg, backend, workload, bundles, preload, slots, on_head=on_head, resumed=found
    )


# Folders a Databricks cluster mounts on every node: shared without storage_shared=true.
SHARED_PREFIXES = ("/dbfs/", "/Volumes/")


def check_storage(cfg: DictConfig, backend: ClusterBackend, on_head: OnHead | None = None) -> None:
    """storage_path where every node of the cluster reaches it: an object store that answers
    (probed within storage.PROBE_TIMEOUT_S), or a folder one machine holds for all its nodes, or
    one the user says every node mounts. A dry run probes nothing, and only notes a folder the
    nodes would not share (a provider's defaults alone still render: session.dry_run)."""
    from rayflow.results import storage
    from rayflow.results.experiment import where_kept

    where = where_kept(cfg)
    if cfg.dry_run:
        return
    if storage.is_uri(where):
        try:
            storage.probe(where)
        except storage.StorageError as err:
            raise ConfigError("storage_path", str(err)) from None
        return
    refusal = storage_refusal(cfg, backend, on_head)
    if refusal:
        raise ConfigError("storage_path", refusal)


def storage_refusal(
    cfg: DictConfig, backend: ClusterBackend, on_head: OnHead | None = None
) -> str | None:
    """Why a folder storage_path does not do for the backend's nodes, or None."""
    from rayflow.results.experiment import where_kept

    where = where_kept(cfg)
    if "://" in where or backend.traits.single_machine or cfg.storage_shared:
        return None
    if on_head is not None:  # a job on a head: the side that submitted it checked this
        return None
    if where.startswith(SHARED_PREFIXES):
        return None
    return (
        f"{where} is a folder of one machine, but backend={backend.name} runs trials on "
        "separate machines that do not see it (checkpoints written there are lost to the "
        "others): give an object store every node reaches (storage_path=s3://BUCKET/PATH or "
        "gs://BUCKET/PATH), or a folder every node mounts at that path with storage_shared=true"
    )


def _gpu(cfg: DictConfig) -> set[str]:
    return {"GPU"} if cfg.compute.device == "cuda" else set()


def _no_python_objects(cfg: DictConfig, backend: ClusterBackend) -> None:
    """A job on the cluster imports what the config names: a Python object handed to rayflow.run
    cannot travel there."""
    for key, value in cfg.workload.items():
        if isinstance(value, str) and is_given(value):
            raise ConfigError(
                f"workload.{key}",
                f"a Python object given to rayflow.run ({value}) runs on backends that "
                "connect this process (local, attach, spark); "
                f"for backend={backend.name} put it in a "
                "module of your working_dir and name it module:function",
            )


def _check_gpus(
    cfg: DictConfig, backend: ClusterBackend, nodes: list[dict[str, float]] | None
) -> None:
    """compute=gpu on a cluster whose nodes are known to have no GPU."""
    if (
        cfg.compute.device == "cuda"
        and nodes is not None
        and sum(n.get("GPU", 0.0) for n in nodes) <= 0
    ):
        raise ConfigError(
            "compute",
            f"compute=gpu but backend {backend.name} has no CUDA device; "
            "use compute=cpu or compute=auto",
        )


def _preload(
    workload: Any, cfg: DictConfig, bundles: list[Bundle], slots: int | None
) -> WorkerPreload | None:
    """What Ray's idle workers import as the cluster starts, and how many of them are kept: the
    processes of every trial that runs at once (with one kept per trial, the second of two 1-CPU
    trials started in a cold process: about 1 s more per run, scripts/bench.py tune-overhead)."""
    modules = tuple(workload.worker_imports(cfg))
    if not modules:
        return None
    threads = max((b.resources.get("CPU", 1.0) for b in bundles), default=1.0)
    processes = sum(b.count for b in bundles) * max(1, slots or 1)
    return WorkerPreload(modules, processes, int(threads) or 1)


def _slots(bundles: list[Bundle], nodes: list[dict[str, float]] | None) -> int | None:
    """Trials of the workload's one bundle the cluster holds at once at its largest; None when only
    the running cluster knows its size (attach, sizes left to Spark) or there is no one bundle."""
    if nodes is None or len(bundles) != 1 or bundles[0].count != 1:
        return None
    return copies_at_once(bundles[0], nodes)


def _check_resumed_run(cfg: DictConfig, found: Resumed) -> None:
    """A resumed experiment logs into its first run's MLflow parent run: the store must hold it
    (a relative sqlite:///mlflow.db from another directory is another store). Refused rather than
    started anew, so a resumed experiment's MLflow history stays in one run."""
    run_id = found.state.get("mlflow_run_id")
    if not run_id:
        return
    reason = missing_run(cfg, str(run_id))
    if reason:
        raise ConfigError(
            "resume",
            f"the experiment's MLflow parent run {run_id} is not in tracking.uri: {reason}; "
            "resume from the directory of the first run or give its tracking.uri "
            "(or tracking=none)",
        )


def preflight(
    overrides: list[str], multirun: bool = False, on_head: OnHead | None = None
) -> list[Plan]:
    """Compose and check every job of the command line before any starts: bad input anywhere in
    a sweep is one ConfigError naming the key, with nothing started. `on_head`: this is a
    submitted run's job on its cluster's head."""
    points = config_errors(lambda: sweep_points(list(overrides), multirun))
    return [config_errors(functools.partial(_plan_point, point, on_head)) for point in points]


def _plan_point(point: list[str], on_head: OnHead | None) -> Plan:
    """One point of the command line: composed (a resume: the experiment's own config), checked."""
    cfg = compose_config(*point)
    if cfg.resume is False:
        return plan_job(cfg, point, on_head)
    found = resumed_folder(cfg)  # located and its state read: once, for the whole job
    # a submitted run's head: its submitter asked for the secrets
    point, cfg = resumed(point, cfg, asks=on_head is None, found=found)
    return plan_job(cfg, point, on_head, found)
