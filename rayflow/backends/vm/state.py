"""backend=vm: clusters have owners. Which cluster of a name this user's runs started, kept and
hold.

A cluster is found again by its name only through this user's own state folder
(`~/.cache/rayflow/vm`, or under $XDG_CACHE_HOME; 0700, checked to be this user's, never a shared
/tmp path): `NAME.json` records the run that started the cluster (`owner_run`), whether it was kept
(`keep_cluster=true`), the run that holds it now (`holder`: run id, pid and the process's start
time, so a reused pid is not mistaken for it) and how to reach and stop it (`stop`: the cluster
YAML of an SDK cluster, kept beside it in `NAME/NAME.yaml` (rayflow.backends.vm.owned), or a fake
cluster's temp dir). Claims go through
`NAME.lock` (filelock, a bounded wait): a run either claims the name for a cluster it starts, joins
a kept cluster that no live run holds, or is refused in one line naming backend.cluster_name. A run
tears down only a cluster it started and did not keep; at its end it lets go of the name
(`release`).

Names are validated (rayflow.backends.vm.rules.cluster_name_problem) before they name a file here.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeGuard

import psutil

from rayflow.backends.vm.rules import cluster_name_problem
from rayflow.errors import ClusterError, ConfigError
from rayflow.security.auth import cache_dir
from rayflow.security.redaction import redact

KEY = "backend.cluster_name"
LOCK_TIMEOUT_S = 30.0  # a claim is a read and a write: another run holds the lock for milliseconds


def state_dir() -> Path:
    """This user's own folder for cluster state, 0700; refused when it is not this user's."""
    root = cache_dir() / "vm"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for folder in (root.parent, root):
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
            raise ClusterError(
                f"backend=vm: {folder} is not a folder of this user's "
                f"(a link, or owned by uid {info.st_uid}): "
                "rayflow keeps its cluster state there; remove it"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            folder.chmod(0o700)
    return root


def state_file(name: str) -> Path:
    problem = cluster_name_problem(name)
    if problem:  # the checks refused it already; a state path is built from a valid name only
        raise ConfigError(KEY, problem)
    return state_dir() / f"{name}.json"


def read(name: str) -> dict | None:
    try:
        state = json.loads(state_file(name).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _write(name: str, state: dict) -> None:
    path = state_file(name)
    part = path.with_suffix(".json.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(redact(state), f)
    os.replace(part, path)


def me(run_id: str) -> dict:
    return {"run": run_id, "pid": os.getpid(), "started": psutil.Process().create_time()}


def holds(holder: dict | None) -> TypeGuard[dict]:
    """Whether the run recorded as holder is still alive (its pid, started when it was)."""
    if not isinstance(holder, dict):
        return False
    try:
        return (
            abs(psutil.Process(int(holder["pid"])).create_time() - float(holder["started"])) < 1.0
        )
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


class _Lock:
    def __init__(self, name: str):
        import filelock

        self._lock = filelock.FileLock(
            str(state_file(name).with_suffix(".lock")), timeout=LOCK_TIMEOUT_S, mode=0o600
        )

    def __enter__(self) -> None:
        import filelock

        try:
            self._lock.acquire()
        except filelock.Timeout:
            raise ClusterError(
                "backend=vm: another run held the lock of this cluster name "
                f"for more than {LOCK_TIMEOUT_S:g} s"
            ) from None

    def __exit__(self, *exc) -> None:
        self._lock.release()


def claim(
    name: str,
    run_id: str,
    provider: str,
    keep: bool,
    running: Callable[[dict | None], bool],
    record_new: bool = True,
) -> dict | None:
    """Under the name's lock: the state of a kept cluster of this name that no live run holds,
    now held by this run (join it), or None: nothing of this name runs, and the name is this
    run's (recorded when `record_new`). `running(state)` says whether a cluster of this name is
    alive (the provider's own view for clouds and hosts). Refused in one line otherwise."""
    with _Lock(name):
        state = read(name)
        holder = (state or {}).get("holder")
        if holds(holder) and holder.get("run") != run_id:
            raise ConfigError(
                KEY,
                f"a cluster named {name!r} is in use by another run of yours "
                f"(pid {holder['pid']}): give this run "
                f"a name of its own (backend.cluster_name=...), or wait for that run to end",
            )
        if running(state):
            if not (state and state.get("kept") and state.get("provider") == provider):
                raise ConfigError(
                    KEY,
                    f"a cluster named {name!r} is running ({provider}) that no run of yours kept "
                    "(keep_cluster=true): rayflow joins only a kept cluster "
                    "and never restarts or stops "
                    "another's; give this run a name of its own (backend.cluster_name=...)"
                    + (
                        f", or stop it: python -m rayflow.backends.vm.teardown {state['stop']}"
                        if state and state.get("stop")
                        else ""
                    ),
                )
            state["holder"] = me(run_id)
            _write(name, state)
            return state
        if record_new:
            _write(
                name,
                {
                    "cluster_name": name,
                    "provider": provider,
                    "owner_run": run_id,
                    "kept": bool(keep),
                    "holder": me(run_id),
                    "claimed_at": time.time(),
                },
            )
        return None


def update(name: str, run_id: str, **fields: object) -> None:
    """Add what the holder learnt (temp dir, URL, how to stop it) to its record."""
    with _Lock(name):
        state = read(name)
        if state and (state.get("holder") or {}).get("run") == run_id:
            _write(name, {**state, **fields})


def release(name: str, run_id: str) -> None:
    """At the run's end: the record of a cluster this run started and did not keep goes (the
    cluster was torn down), a kept one stays, held by nobody. Others' records are left alone."""
    with _Lock(name):
        state = read(name)
        if not state or (state.get("holder") or {}).get("run") != run_id:
            return
        if state.get("owner_run") == run_id and not state.get("kept"):
            state_file(name).unlink(missing_ok=True)
        else:
            _write(name, {**state, "holder": None})


def forget(stop_path: str) -> None:
    """`python -m rayflow.backends.vm.teardown PATH` stopped a cluster: drop the records that name
    PATH."""
    folder = cache_dir() / "vm"
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and state.get("stop") == stop_path:
            path.unlink(missing_ok=True)
