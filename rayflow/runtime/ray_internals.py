"""The one door to Ray's private modules (`ray._private`, `ray._raylet`) and to the private names
and attributes of its public ones (Ray on Spark's, the Jobs client's): every use of them in
rayflow/ goes through a function here (tests/test_layout.py holds it so), so a Ray upgrade is
checked in one place. Each entry says why no public Ray API does the same.
Nothing is imported before a function is called: importing rayflow imports no Ray.

This module imports nothing of rayflow: rayflow.security.result_channel, below this layer, may
call it (pyproject.toml's one ignore_imports). Not here, as Ray's launcher is only backend=vm's:
`ray.autoscaler._private`, through rayflow.backends.vm.internals. Hydra's:
rayflow.runtime.hydra_internals."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# --- The workers' log lines on the driver (ray._private.ray_logging, ray._private.worker) ---------
# Ray hands its workers' lines to the driver only through its dispatcher; the public API switches
# them on or off (ray.init(log_to_driver=...)) and offers no hook: rayflow's run log takes them
# over (every line into the file, the shown ones printed as Ray prints them).


def worker_log_dispatcher() -> Any:
    """Ray's dispatcher of its workers' lines on this driver (add_handler, remove_handler);
    ray.init(log_to_driver=True) adds its printer there as "ray_print_logs". No public handle."""
    from ray._private import ray_logging

    return ray_logging.global_worker_stdstream_dispatcher


def worker_log_handlers(name: str) -> list[Any]:
    """The dispatcher's handlers registered as `name`, read under its lock (`_lock`, `handlers`:
    Ray's printer is found there to be replaced, then put back; no public call lists them)."""
    dispatcher = worker_log_dispatcher()
    with dispatcher._lock:
        return [handler for found, handler in dispatcher.handlers if found == name]


def worker_log_lock() -> contextlib.AbstractContextManager[Any]:
    """The dispatcher's lock (nothing is printed of the workers' lines while it is held), or a
    lock that holds nothing where this Ray has none: Ray offers no public way to hold its log
    thread back."""
    return getattr(worker_log_dispatcher(), "_lock", None) or contextlib.nullcontext()


def ignore_worker_log_prefix() -> bool:
    """Whether Ray prints the workers' lines without their `(pid=..., ip=...)` prefix on this
    driver (worker._should_ignore_worker_log_prefix): Ray's printer decides it where it is
    installed, and rayflow's, which replaces it, must print alike. No public setting reads it."""
    from ray._private import worker

    return bool(worker._should_ignore_worker_log_prefix(worker.global_worker))


def print_worker_lines(data: dict, ignore_prefix: bool) -> None:
    """A batch of a worker's lines printed as Ray's own printer prints it (its colours,
    prefix and deduplication: worker.print_to_stdstream); no public printer exists."""
    from ray._private import worker

    worker.print_to_stdstream(data, ignore_prefix)


def flush_worker_log_deduplicators(ignore_prefix: bool) -> None:
    """What Ray's deduplicators hold back (`[repeated 9x across cluster]`) printed now, as
    ray.shutdown prints it (ray._private.worker.disconnect): Ray flushes them only there, and
    rayflow prints them before its results instead of below them."""
    from ray._private import ray_logging, worker

    for leftover in ray_logging.stdout_deduplicator.flush():
        worker.print_worker_logs(leftover, sys.stdout, ignore_prefix)
    for leftover in ray_logging.stderr_deduplicator.flush():
        worker.print_worker_logs(leftover, sys.stderr, ignore_prefix)


# --- This driver's Ray ----------------------------------------------------------------------------


def driver_gcs_client() -> Any:
    """The connected driver's GCS client (worker.global_worker.gcs_client, set when it connects;
    the class does not declare it): ray.autoscaler.v2.sdk.get_cluster_resource_state, which reads
    the pending demands `ray status` shows, takes one, and the public API hands none out."""
    from ray._private import worker

    return worker.global_worker.gcs_client


def local_node() -> Any:
    """The node (GCS, raylet, dashboard) ray.init started in this process (worker._global_node;
    declared `_global_node = None`, so read as Any): its kill_all_processes ends what a shutdown
    left of it, and ray.init's returned context holds only addresses."""
    from ray._private import worker

    return worker._global_node


def reread_config_if_imported() -> None:
    """Ray's C++ config re-read from the environment (the auth mode) where Ray is imported
    (ray._raylet.Config.initialize, as Ray's own token setup does): Ray reads it once at import,
    and no public call reads it again. Ray is not imported for it."""
    if "ray._raylet" in sys.modules:
        sys.modules["ray._raylet"].Config.initialize("")


def ray_address_env_var() -> str:
    """The variable a job's driver finds its cluster's address in (RAY_ADDRESS in Ray 2.60;
    ray_constants.RAY_ADDRESS_ENVIRONMENT_VARIABLE): no public constant names it."""
    from ray._private import ray_constants

    return str(ray_constants.RAY_ADDRESS_ENVIRONMENT_VARIABLE)


def dashboard_address_from_gcs(address: str, timeout_s: float) -> bytes | None:
    """The `host:port` the head's dashboard recorded in the GCS at `address` (its internal KV,
    ray_constants.DASHBOARD_ADDRESS in KV_NAMESPACE_DASHBOARD), asked by a bare GcsClient
    (ray._raylet): the public ways to it (ray.init's dashboard_url) connect a driver, which the
    autostop watcher must not, as a driver counts as activity."""
    from ray._private import ray_constants
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # a Cython class

    found = GcsClient(address=address).internal_kv_get(
        ray_constants.DASHBOARD_ADDRESS.encode(),
        namespace=ray_constants.KV_NAMESPACE_DASHBOARD,
        timeout=timeout_s,
    )
    return found or None


def jobs_client_request_options(client: Any) -> dict[str, Any]:
    """What a Jobs API client sends with each request (JobSubmissionClient's `_headers`, with the
    token; `_cookies`; `_verify`, its TLS setting), for requests.get: rayflow streams a job's log
    keeping only its end, where the client's get_job_logs reads the whole answer into memory, and
    the client hands these out only as private attributes."""
    return {"headers": client._headers, "cookies": client._cookies, "verify": client._verify}


# --- A submitted job's files, packed as Ray packs them (ray._private.runtime_env, ray_constants) --
# rayflow checks a job's files before anything starts (the preflight), as Ray would pack them at
# the submission: Ray's packing has no public dry run, so its own pieces are called.


def default_excludes() -> list[str]:
    """What Ray itself drops from a working_dir (.git, .venv, venv, __pycache__ in Ray 2.60;
    ray_constants.get_runtime_env_default_excludes, absent from older Rays): no public list."""
    from ray._private import ray_constants

    get = getattr(ray_constants, "get_runtime_env_default_excludes", None)
    return list(get()) if get is not None else []


def dashboard_body_limit(default: int) -> int:
    """The largest request body the dashboard takes (ray_constants.DASHBOARD_CLIENT_MAX_SIZE),
    `default` where this Ray has none: a package over it is refused at the upload, and no public
    constant says so."""
    from ray._private import ray_constants

    return int(getattr(ray_constants, "DASHBOARD_CLIENT_MAX_SIZE", default))


def gcs_package_limit() -> int:
    """The size from which the GCS refuses a package (packaging.GCS_STORAGE_MAX_SIZE, 512 MiB
    in Ray 2.60): no public constant."""
    from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

    return int(GCS_STORAGE_MAX_SIZE)


def ignore_gitignore_env_var() -> str:
    """The variable that turns off Ray's honouring of .gitignore when it packs
    (ray_constants.RAY_RUNTIME_ENV_IGNORE_GITIGNORE): no public constant names it."""
    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE

    return str(RAY_RUNTIME_ENV_IGNORE_GITIGNORE)


def walk_package(
    root: Path,
    patterns: list[str],
    handler: Callable[[Path], None],
    include_gitignore: bool,
    logger: logging.Logger,
) -> None:
    """Ray's own traversal of what it packs of `root` (packaging._dir_travel, with the excludes
    `patterns` as packaging._get_excludes matches them and the per-folder .gitignore and
    .rayignore files), `handler` called on each file and empty folder: the only way to know what
    Ray would ship short of packing it."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    _dir_travel(
        root,
        [_get_excludes(root, list(patterns))],
        handler,
        include_gitignore=include_gitignore,
        logger=logger,
    )


def ray_pathspec(patterns: Iterable[str]) -> Any:
    """`patterns` as Ray matches a job's excludes (gitwildmatch, match_file): with Ray's own copy
    of pathspec (ray._private.thirdparty.pathspec), whose negation differs from pathspec 1.x's,
    which is all a public import would give."""
    from ray._private.thirdparty.pathspec import PathSpec

    return PathSpec.from_lines("gitwildmatch", patterns)


def job_config_env_var() -> str:
    """The variable Ray hands a job's driver its job config in, whose runtime_env the driver's
    workers get (runtime_env.constants.RAY_JOB_CONFIG_JSON_ENV_VAR): no public constant names it,
    and rayflow scrubs the keys it hands a job's driver out of it (result_channel)."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    return str(RAY_JOB_CONFIG_JSON_ENV_VAR)


# --- Ray on Spark (ray.util.spark.cluster_init) ---------------------------------------------------


def active_ray_on_spark_cluster() -> Any:
    """The Ray-on-Spark cluster this process started (cluster_init._active_ray_cluster: its head
    process, dashboard port and temp dir), None before setup_ray_cluster has started a head:
    setup_ray_cluster returns addresses only, and no public call returns the cluster."""
    from ray.util.spark import cluster_init

    return cluster_init._active_ray_cluster


# Ray on Spark sizes its worker nodes only inside setup_ray_cluster, which starts them; the sizing
# plan of a dry run (rayflow.backends.spark.plan) runs its formula, where Spark workers run, with
# nothing started: the helpers of ray.util.spark.utils, all private names.


def spark_worker_cores() -> int:
    """The CPU cores of the Spark worker this runs on, as Ray on Spark counts them
    (utils._get_cpu_cores: RAY_ON_SPARK_WORKER_CPU_CORES, else the machine's)."""
    from ray.util.spark.utils import _get_cpu_cores

    return _get_cpu_cores()


def spark_worker_gpus() -> int:
    """The GPUs of the Spark worker this runs on, as Ray on Spark counts them
    (utils._get_num_physical_gpus: RAY_ON_SPARK_WORKER_GPU_NUM, else nvidia-smi's)."""
    from ray.util.spark.utils import _get_num_physical_gpus

    return _get_num_physical_gpus()


def spark_worker_memory() -> int:
    """The physical memory of the Spark worker this runs on, as Ray on Spark reads it
    (utils._get_spark_worker_total_physical_memory)."""
    from ray.util.spark.utils import _get_spark_worker_total_physical_memory

    return _get_spark_worker_total_physical_memory()


def ray_on_spark_node_memory(
    num_cpus: int, num_gpus: int, heap: int | None, object_store: int | None
) -> tuple[int, int, str | None, str | None]:
    """Ray on Spark's sizing of one Ray worker node here (utils._get_avail_mem_per_ray_worker_node):
    (heap bytes, object store bytes, error, warning)."""
    from ray.util.spark.utils import _get_avail_mem_per_ray_worker_node

    heap_bytes, store_bytes, err, warning = _get_avail_mem_per_ray_worker_node(
        num_cpus, num_gpus, heap, object_store
    )
    return heap_bytes, store_bytes, err, warning


__all__ = [
    "active_ray_on_spark_cluster",
    "dashboard_address_from_gcs",
    "dashboard_body_limit",
    "default_excludes",
    "driver_gcs_client",
    "flush_worker_log_deduplicators",
    "gcs_package_limit",
    "ignore_gitignore_env_var",
    "ignore_worker_log_prefix",
    "job_config_env_var",
    "jobs_client_request_options",
    "local_node",
    "print_worker_lines",
    "ray_address_env_var",
    "ray_on_spark_node_memory",
    "ray_pathspec",
    "reread_config_if_imported",
    "spark_worker_cores",
    "spark_worker_gpus",
    "spark_worker_memory",
    "walk_package",
    "worker_log_dispatcher",
    "worker_log_handlers",
    "worker_log_lock",
]
