"""What a test looks at to know a cluster is gone: the processes left on this machine (psutil).

A test session marks itself (`mark_session`): every process its tests start inherits the
mark through its environment (the drivers, Ray's daemons and workers, Spark's JVMs, the
nodes Ray on Spark and fake_multinode start), and these checks then see that session's
processes only, never those of another suite, another session's worker or a user's cluster
on the same machine. Unmarked, they see every process of this user, as a backend's own suite
run by hand. Another user's processes never count, whatever they are named: anyone can start a
process called `/tmp/x/raylet`, and it is not a cluster this session left behind.
"""

from __future__ import annotations

import os
import time

import psutil

from rayflow.runtime.processes import is_own

SESSION_MARK = "RAYFLOW_TEST_SESSION"


def mark_session() -> str:
    """Mark this process, and so every process it starts from now on, as this test session's."""
    os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"
    return os.environ[SESSION_MARK]


def _ours(proc: psutil.Process) -> bool:
    if not is_own(proc):  # another user's (or gone): never this session's
        return False
    mark = os.environ.get(SESSION_MARK)
    if mark is None:
        return True
    try:
        return proc.environ().get(SESSION_MARK) == mark
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False  # gone, or a zombie: nothing left running


def _cmdlines():
    for proc in psutil.process_iter(["pid", "cmdline"]):
        yield proc, proc.info["cmdline"] or []


def ray_daemon_pids() -> set[int]:
    """Pids of the processes a cluster leaves if not stopped: Ray's GCS servers and raylets,
    and Spark JVMs (the py4j gateway, executors) on this machine."""
    pids = set()
    for proc, argv in _cmdlines():
        if not argv:
            continue
        daemon = argv[0].endswith(("/gcs_server", "/raylet"))
        jvm = argv[0].endswith("java") and any(a.startswith("org.apache.spark") for a in argv)
        if (daemon or jvm) and _ours(proc):
            pids.add(proc.pid)
    return pids


def process_pids(title: bytes | str) -> set[int]:
    """Pids of processes whose command line starts with `title`: Ray names an actor's
    process after its class, e.g. "ray::RayTrainWorker" or "ray::ImplicitFunc"."""
    prefix = title.decode() if isinstance(title, bytes) else title
    return {
        proc.pid for proc, argv in _cmdlines() if " ".join(argv).startswith(prefix) and _ours(proc)
    }


def wait_until(predicate, timeout: float, interval: float = 0.25):
    """The predicate's first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
