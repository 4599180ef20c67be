"""Stopping exactly the processes of one Ray cluster on this machine (psutil).

`ray stop` stops every Ray process it can see on the machine, by name, including clusters
that are not ours (a notebook's, another user's, a test's). A cluster rayflow starts on this
machine gets a temp dir of its own (`ray start --temp-dir=...`); every one of its processes
names that folder on its command line, so teardown stops those and nothing else.
"""

from __future__ import annotations

import os
import time

import psutil


def processes_mentioning(text: str) -> list[psutil.Process]:
    """This machine's processes (not this one) whose command line contains `text`."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.pid != os.getpid() and any(text in arg for arg in cmdline):
            found.append(proc)
    return found


def pids_mentioning(text: str) -> set[int]:
    """Pids of this machine's processes whose command line contains `text`."""
    return {proc.pid for proc in processes_mentioning(text)}


def terminate(procs: list[psutil.Process], timeout_s: float = 30.0) -> list[psutil.Process]:
    """SIGTERM, wait up to timeout_s (a zombie counts as gone), then SIGKILL what is left;
    returns the processes killed hard."""
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    # Not psutil.wait_procs: it waits for a zombie (an orphan nobody reaps, as under a container
    # init that does not reap) until the timeout, though the process has exited.
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # a zombie has exited; its parent has not reaped it
    except psutil.NoSuchProcess:
        return False


# Ray's own shutdown (ray._private.node.Node.kill_all_processes) stops the raylet first, so it
# can stop its workers, and gives each process one second after SIGTERM before SIGKILL. Some of
# Ray 2.60's daemons (the autoscaler's monitor.py, at times gcs_server mid-flush) outlive a
# SIGTERM by tens of seconds: a longer grace only makes every teardown that much slower.
GRACE_S = 3.0


def stop_processes_mentioning(text: str, timeout_s: float = GRACE_S) -> None:
    """Stop every process naming `text` (a cluster's own temp dir): its raylets first, as Ray
    does, then the rest, SIGKILLing what outlives `timeout_s`; a last sweep catches processes a
    dying one started meanwhile."""
    raylets = [p for p in processes_mentioning(text) if _name(p) == "raylet"]
    if raylets:
        terminate(raylets, timeout_s)
    for _ in range(2):
        procs = processes_mentioning(text)
        if not procs:
            return
        terminate(procs, timeout_s)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL at once every process naming `text`: the fallback behind a graceful stop."""
    terminate(processes_mentioning(text), timeout_s=0)
