"""What a test looks at to know a cluster is gone: the processes left on this machine."""

from __future__ import annotations

import time
from pathlib import Path


def ray_daemon_pids() -> set[int]:
    """Pids of the processes a cluster leaves if not stopped: Ray's GCS servers and raylets,
    and Spark JVMs (the py4j gateway, executors) on this machine."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith((b"/gcs_server", b"/raylet")):
            pids.add(int(entry.name))
        elif argv[0].endswith(b"java") and any(a.startswith(b"org.apache.spark") for a in argv):
            pids.add(int(entry.name))
    return pids


def process_pids(title: bytes) -> set[int]:
    """Pids of processes whose command line starts with `title`: Ray names an actor's
    process after its class, e.g. b"ray::RayTrainWorker" or b"ray::ImplicitFunc"."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(title):
                pids.add(int(entry.name))
        except OSError:
            pass
    return pids


def wait_until(predicate, timeout: float, interval: float = 0.25):
    """The predicate's first truthy value within `timeout` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
