"""Stopping exactly the processes of one Ray cluster on this machine (psutil).

`ray stop` stops every Ray process it can see on the machine, by name, including clusters
that are not ours (a notebook's, another user's, a test's). A cluster rayflow starts on this
machine gets a temp dir of its own (`ray start --temp-dir=...`); every one of its processes
names that folder (or a path inside it) on its command line, so teardown stops those and
nothing else.

A command line is anyone's to write: another user's `sleep 60 /tmp/rf-vm-x` names the folder
too. So a process is ours only when it runs as this user (real and effective uid both this
process's real uid: root's teardown never signals another user's process), and, where the
caller recorded the process group it started the cluster in, only inside that group. A process
that goes away, turns zombie or refuses to be inspected meanwhile is skipped, never an error:
teardown goes on to the rest.
"""

from __future__ import annotations

import contextlib
import os
import re
import time

import psutil

# What psutil raises for a process that went away, exited unreaped, or is not ours to inspect.
GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def is_own(proc: psutil.Process) -> bool:
    """Whether `proc` runs as this user: real and effective uid both this process's real uid."""
    try:
        uids = proc.uids()
    except GONE:
        return False
    return uids.real == uids.effective == os.getuid()


def _names_path(path: str):
    """A test for a command-line argument naming `path` itself or a path inside it, alone or as
    an option's value (`--temp-dir=P`, `--session-dir=P/session_...`): not `P2`, `Pfoo` or
    `/elsewhere/P`. A relative `path` is taken from the working directory, as a path argument is."""
    path = os.path.abspath(path)
    pattern = re.compile(r"(?<![^\s'\"=,;:])" + re.escape(path) + r"(?=$|[/\s'\",;:])")
    return lambda arg: pattern.search(arg) is not None


def processes_mentioning(text: str, pgid: int | None = None) -> list[psutil.Process]:
    """This user's processes (not this one) whose command line names the path `text`; with
    `pgid`, only that process group's: start `ray start --head` with `start_new_session=True`
    and pass its pid, since Ray's daemons and workers stay in the group of the process that
    started them (unless RAY_process_group_cleanup_enabled gives each worker its own; the raylet
    still stops those)."""
    names = _names_path(text)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []  # None where it could not be read
        if proc.pid == os.getpid() or not any(names(arg) for arg in cmdline):
            continue
        if is_own(proc) and (pgid is None or _pgid(proc) == pgid):
            found.append(proc)
    return found


def _pgid(proc: psutil.Process) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:  # gone meanwhile
        return None


def pids_mentioning(text: str, pgid: int | None = None) -> set[int]:
    """Pids of this user's processes whose command line names the path `text`."""
    return {proc.pid for proc in processes_mentioning(text, pgid)}


def terminate(procs: list[psutil.Process], timeout_s: float = 30.0) -> list[psutil.Process]:
    """SIGTERM, wait up to timeout_s (a zombie counts as gone), then SIGKILL what is left;
    returns the processes killed hard. Only this user's processes are signalled."""
    procs = [p for p in procs if is_own(p)]  # whoever built the list: never another user's
    for proc in procs:
        with contextlib.suppress(*GONE):
            proc.terminate()
    # Not psutil.wait_procs: it waits for a zombie (an orphan nobody reaps, as under a container
    # init that does not reap) until the timeout, though the process has exited.
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    for proc in alive:
        with contextlib.suppress(*GONE):
            proc.kill()
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        # a zombie has exited; its parent has not reaped it
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:  # alive, but no longer ours to inspect: not ours to wait for either
        return False


# Ray's own shutdown (ray._private.node.Node.kill_all_processes) stops the raylet first, so it
# can stop its workers, and gives each process one second after SIGTERM before SIGKILL. Some of
# Ray 2.60's daemons (the autoscaler's monitor.py, at times gcs_server mid-flush) outlive a
# SIGTERM by tens of seconds: a longer grace only makes every teardown that much slower.
GRACE_S = 3.0


def stop_processes_mentioning(
    text: str, timeout_s: float = GRACE_S, pgid: int | None = None
) -> None:
    """Stop every process of this user naming the path `text` (a cluster's own temp dir; with
    `pgid`, of that process group only): its raylets first, as Ray does, then the rest,
    SIGKILLing what outlives `timeout_s`; a last sweep catches processes a dying one started
    meanwhile."""
    raylets = [p for p in processes_mentioning(text, pgid) if _name(p) == "raylet"]
    if raylets:
        terminate(raylets, timeout_s)
    for _ in range(2):
        procs = processes_mentioning(text, pgid)
        if not procs:
            return
        terminate(procs, timeout_s)


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except GONE:
        return ""


def kill_processes_mentioning(text: str, pgid: int | None = None) -> None:
    """SIGKILL at once every process of this user naming the path `text`: the fallback behind a
    graceful stop."""
    terminate(processes_mentioning(text, pgid), timeout_s=0)
