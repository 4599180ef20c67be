"""Stopping exactly the processes of one Ray cluster on this machine (psutil).

`ray stop` stops every Ray process it can see on the machine, by name, including clusters
that are not ours (a notebook's, another user's, a test's). A cluster rayflow starts on this
machine gets a temp dir of its own (`ray start --temp-dir=...`); every one of its processes
names that folder on its command line, so teardown stops those and nothing else.
"""

from __future__ import annotations

import os

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
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
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


def stop_processes_mentioning(text: str, timeout_s: float = 30.0) -> None:
    """Stop every process naming `text` (a cluster's own temp dir), including ones a dying
    process starts meanwhile: a second sweep catches them."""
    for _ in range(2):
        procs = processes_mentioning(text)
        if not procs:
            return
        terminate(procs, timeout_s)


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL at once every process naming `text`: the fallback behind a graceful stop."""
    terminate(processes_mentioning(text), timeout_s=0)
