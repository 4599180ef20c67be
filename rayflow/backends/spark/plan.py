"""The sizing plan `dry_run=true` prints for backend=spark: what Ray on Spark will build.

The "helper to populate the parameters" the Databricks guide links to, built in. It uses
Ray's own per-node memory formula, run where Spark workers run: for a local-cluster
master that is this machine (no JVM needed); with an active SparkSession, one Spark task.
"""

from __future__ import annotations

import re

from rayflow.runtime import ray_internals

GIB = 1024**3


def active_session():
    """The SparkSession this process already has (a Databricks notebook's), or None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _worker_facts(num_cpus, num_gpus, heap, object_store) -> dict:
    """Run on a Spark worker: its cores, GPUs, memory and Ray's sizing of one Ray node there."""
    cores, gpus = ray_internals.spark_worker_cores(), ray_internals.spark_worker_gpus()
    cpus = num_cpus if num_cpus is not None else cores
    gpus_per_node = num_gpus if num_gpus is not None else gpus
    heap_bytes, store_bytes, err, warning = ray_internals.ray_on_spark_node_memory(
        cpus, gpus_per_node, heap, object_store
    )
    return {
        "cores": cores,
        "gpus": gpus,
        "memory_bytes": ray_internals.spark_worker_memory(),
        "node_cpus": cpus,
        "node_gpus": gpus_per_node,
        "heap_bytes": heap_bytes,
        "object_store_bytes": store_bytes,
        "error": err,
        "warning": warning,
    }


def _spark_workers(cfg, session) -> tuple[str, int | None, int | None]:
    """(source, Spark workers, cores per Spark worker as Spark schedules them)."""
    if session is not None:
        sc = session.sparkContext
        executors = max(sc._jsc.sc().getExecutorMemoryStatus().size() - 1, 1)
        return "active SparkSession", executors, max(sc.defaultParallelism // executors, 1)
    match = re.match(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,", str(cfg.backend.master))
    if match:
        return "local-cluster master", int(match.group(1)), int(match.group(2))
    return (
        "unknown until the cluster is reached (the plan below assumes this machine's size)",
        None,
        None,
    )


def _facts_where_workers_run(b, session) -> dict:
    """_worker_facts of a Ray worker node the size `b` asks for: in a Spark task of the active
    session, else on this machine (a local-cluster master's workers)."""
    args = (
        b.num_cpus_worker_node,
        b.num_gpus_worker_node,
        b.memory_worker_node,
        b.object_store_memory_worker_node,
    )
    if session is not None:
        facts: dict = (
            session.sparkContext.parallelize([1], 1)
            .map(lambda _: _worker_facts(*args))
            .collect()[0]
        )
        return facts
    return _worker_facts(*args)


def _warnings(b, facts: dict, workers: int | None, possible: int | None) -> list[str]:
    """What Ray would warn about, or fail on, with these sizes, and what Spark cannot hold."""
    warnings = []
    if facts["node_cpus"] < 4:
        warnings.append(
            f"Ray warns: {facts['node_cpus']} CPUs per Ray worker node is below the recommended 4"
        )
    if facts["heap_bytes"] < 10 * GIB:
        warnings.append(
            f"Ray warns: {facts['heap_bytes'] / GIB:.1f} GiB heap per Ray worker node "
            "is below the recommended 10 GiB"
        )
    if facts["warning"]:
        warnings.append(f"Ray warns: {facts['warning']}")
    if facts["error"]:
        warnings.append(f"Ray fails: {facts['error'].splitlines()[0]}")
    if possible is not None and b.max_worker_nodes > possible:
        warnings.append(
            f"max_worker_nodes={b.max_worker_nodes} exceeds the {possible} Ray worker nodes "
            "the Spark workers can hold"
        )
    if b.hybrid and workers is None:
        warnings.append(
            "hybrid: keep max_worker_nodes below the Spark workers so Spark jobs keep capacity"
        )
    return warnings


def _head_node(b) -> dict:
    """The head node's size: Ray on Spark gives a head left at its defaults 1 GiB of each."""
    head_default = (
        (b.num_cpus_head_node or 0) == 0
        and (b.num_gpus_head_node or 0) == 0
        and b.object_store_memory_head_node is None
    )
    return {
        "cpus": b.num_cpus_head_node or 0,
        "gpus": b.num_gpus_head_node or 0,
        "heap_bytes": GIB if head_default else b.memory_head_node,
        "object_store_bytes": GIB if head_default else b.object_store_memory_head_node,
    }


def sizing_plan(cfg, spark_conf: dict[str, str]) -> dict:
    """What Ray on Spark will build from `cfg.backend` and `spark_conf`, as plain data."""
    b = cfg.backend
    session = active_session()
    source, workers, cores = _spark_workers(cfg, session)
    facts = _facts_where_workers_run(b, session)
    task_cpus = int(spark_conf.get("spark.task.cpus", 1))
    cores = cores or facts["cores"]
    per_worker = max(cores // max(facts["node_cpus"], 1), 0)
    possible = per_worker * workers if workers is not None else None
    warnings = _warnings(b, facts, workers, possible)
    return {
        "source": source,
        "spark_workers": workers,
        "cores_per_spark_worker": cores,
        "gpus_per_spark_worker": facts["gpus"],
        "physical_memory_bytes_per_spark_worker": facts["memory_bytes"],
        "spark_task_slots_per_worker": max(cores // max(task_cpus, 1), 1),
        "ray_worker_nodes_per_spark_worker": per_worker,
        "ray_worker_nodes": {
            "min": b.min_worker_nodes,
            "max": b.max_worker_nodes,
            "possible": possible,
            "autoscaling": b.min_worker_nodes < b.max_worker_nodes,
        },
        "ray_worker_node": {
            "cpus": facts["node_cpus"],
            "gpus": facts["node_gpus"],
            "heap_bytes": facts["heap_bytes"],
            "object_store_bytes": facts["object_store_bytes"],
        },
        "ray_head_node": _head_node(b),
        "warnings": warnings,
    }
