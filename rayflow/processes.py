"""Stopping exactly the processes of one Ray cluster on this machine.

`ray stop` stops every Ray process it can see on the machine, by name, including clusters
that are not ours (a notebook's, another user's, a test's). A cluster rayflow starts on this
machine gets a temp dir of its own (`ray start --temp-dir=...`); every one of its processes
names that folder on its command line, so teardown stops those and nothing else.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def pids_mentioning(text: str) -> set[int]:
    """Pids of this machine's processes whose command line contains `text`."""
    needle, found = text.encode(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


def terminate(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    """SIGTERM, wait up to timeout_s, then SIGKILL what is left; returns the pids killed hard."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _alive(pid)}
        time.sleep(0.2)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def stop_processes_mentioning(text: str, timeout_s: float = 30.0) -> None:
    """Stop every process naming `text` (a cluster's own temp dir), including ones a dying
    process starts meanwhile: a second sweep catches them."""
    for _ in range(2):
        pids = pids_mentioning(text)
        if not pids:
            return
        terminate(pids, timeout_s)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has exited; its parent has not reaped it yet


def kill_processes_mentioning(text: str) -> None:
    """SIGKILL at once every process naming `text`: the fallback behind a graceful stop."""
    terminate(pids_mentioning(text), timeout_s=0)
