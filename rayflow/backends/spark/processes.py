"""The processes a Spark run starts here, ended whole: Ray on Spark's head node and its tree, and
the py4j gateway JVM behind a SparkSession rayflow built."""

from __future__ import annotations

import contextlib
import logging
import subprocess

import psutil

logger = logging.getLogger(__name__)


def end_head(head, known: list[psutil.Process], timeout: float = 30, grace: float = 10) -> None:
    """Whatever Ray on Spark's head node left after shutdown_ray_cluster(), ended. The head is
    Ray on Spark's launcher around `ray start --block`: on SIGTERM it gives `ray start` 5 s, then
    kills only that process, so under load its GCS server and raylet (or a `ray start` stuck in
    its own handler) can outlive it, and did once in the suite. Its process tree, `known` (read
    when it started) and what is under it now, is this run's to end; psutil checks each one's
    start time, so a reused PID is never touched."""
    now = tree(head.pid)
    _terminate(head, timeout)
    _reap(list({*known, *now}), grace)


def tree(pid: int) -> list[psutil.Process]:
    """The processes under `pid`, read now."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _reap(processes: list[psutil.Process], grace: float) -> None:
    """Give the head's processes `grace` seconds to end by themselves, then TERM, then KILL."""
    _, alive = psutil.wait_procs(processes, timeout=grace)
    for signal_them in (psutil.Process.terminate, psutil.Process.kill):
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                signal_them(process)
        _, alive = psutil.wait_procs(alive, timeout=5)
    if alive:
        logger.warning("Ray on Spark's head left processes that survived SIGKILL: %s", alive)


def _terminate(process, timeout: float = 30) -> None:
    """Stop a process Ray on Spark started (its head node) if it still runs: TERM, then KILL."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


def shutdown_gateway_jvm() -> None:
    """spark.stop() ends the executors; the py4j gateway JVM lives until Python exits unless
    it is shut down too, and a later SparkSession in this process then starts a new one."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    SparkContext._gateway = None
    SparkContext._jvm = None
    try:
        gateway.shutdown()
    finally:
        if process is not None:
            _terminate(process)


def stop_session_and_jvm(spark) -> None:
    """Stop a SparkSession and the gateway JVM behind it (for code that built its own)."""
    spark.stop()
    shutdown_gateway_jvm()
