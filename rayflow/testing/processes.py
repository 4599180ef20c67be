"""What a test looks at to know a cluster is gone: the processes left on this machine (psutil)."""

from __future__ import annotations

import time

import psutil


def _cmdlines():
    for proc in psutil.process_iter(["pid", "cmdline"]):
        yield proc.pid, proc.info["cmdline"] or []


def ray_daemon_pids() -> set[int]:
    """Pids of the processes a cluster leaves if not stopped: Ray's GCS servers and raylets,
    and Spark JVMs (the py4j gateway, executors) on this machine."""
    pids = set()
    for pid, argv in _cmdlines():
        if not argv:
            continue
        if argv[0].endswith(("/gcs_server", "/raylet")):
            pids.add(pid)
        elif argv[0].endswith("java") and any(a.startswith("org.apache.spark") for a in argv):
            pids.add(pid)
    return pids


def process_pids(title: bytes | str) -> set[int]:
    """Pids of processes whose command line starts with `title`: Ray names an actor's
    process after its class, e.g. "ray::RayTrainWorker" or "ray::ImplicitFunc"."""
    prefix = title.decode() if isinstance(title, bytes) else title
    return {pid for pid, argv in _cmdlines() if " ".join(argv).startswith(prefix)}


def wait_until(predicate, timeout: float, interval: float = 0.25):
    """The predicate's first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
